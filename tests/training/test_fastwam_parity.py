"""FastWAM against what LeRobot 0.6.1 wrote and computed (tests/fixtures/lerobot_fastwam_tiny).

The checkpoint names its frozen parts by relative paths (`./tiny_wan`, `./tiny_wan/tokenizer`), as
LeRobot resolves them from the working directory: the tests run from a private copy of the fixture.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import shutil
import weakref
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

import trainer
from helpers.fixtures import copy_fixture
from helpers.processor_files import read_processors
from trainer.data.dataset import task_bytes
from trainer.errors import ConfigError
from trainer.policies.common import pretrained
from trainer.policies.fastwam import FastWAMConfig
from trainer.policies.fastwam.policy import FastWAMPolicy

TOL = 1e-5  # LeRobot's reruns are bit-identical; its typical mistakes move the loss by 8e-5 or more
CAMERA = "observation.images.front"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_fixture(tmp_path_factory.mktemp("fastwam"), "lerobot_fastwam_tiny")


@pytest.fixture(scope="module")
def policy(folder: Path) -> FastWAMPolicy:
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        loaded = trainer.load_policy("pretrained_model").policy
    assert isinstance(loaded, FastWAMPolicy)
    return loaded


@pytest.fixture(scope="module")
def reference(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "reference.safetensors"))


@pytest.fixture(scope="module")
def meta(folder: Path) -> dict:
    return json.loads((folder / "reference.json").read_text())


def _batch(reference: dict[str, torch.Tensor], meta: dict) -> dict:
    """The preprocessed training batch: `pre.*`, the camera (which LeRobot's normalizer leaves as it is)
    from `raw.*`, the task strings."""
    batch: dict = {k.removeprefix("pre."): v for k, v in reference.items() if k.startswith("pre.")}
    batch[CAMERA] = reference[f"raw.{CAMERA}.uint8"].float() / 255
    batch["task"] = list(meta["task"])
    return batch


def _observation(batch: dict) -> dict:
    """The current frame of the window, as a live observation gives it."""
    return {
        "observation.state": batch["observation.state"][:, 0],
        CAMERA: batch[CAMERA][:, 0],
        "task": batch["task"],
    }


def _draws(reference: dict[str, torch.Tensor]) -> tuple[dict, dict]:
    noise = {"video": reference["loss.noise_video"], "action": reference["loss.noise_action"]}
    time = {"video": reference["loss.timestep_video"], "action": reference["loss.timestep_action"]}
    return noise, time


def _close(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    torch.testing.assert_close(ours, theirs, atol=TOL, rtol=TOL)


def test_lerobots_checkpoint_loads_strictly_without_its_frozen_parts(policy, folder: Path) -> None:
    """Every one of the 139 tensors of model.safetensors is what the model holds, nothing more: the
    frozen UMT5 and VAE are read from tiny_wan/ and never part of the state dict."""
    saved = load_file(str(folder / "pretrained_model" / "model.safetensors"))
    state = policy.state_dict()
    assert len(saved) == 139 and state.keys() == saved.keys()
    assert all(torch.equal(state[k], saved[k]) for k in saved)
    assert sum(p.numel() for p in policy.parameters()) == 72_203
    parts = policy.frozen_parts(torch.device("cpu"))
    assert sum(p.numel() for p in parts.text_encoder.parameters()) == 7_552
    # the VAE's encoder (and quant_conv) alone is read: 54,222 of its 101,832 parameters (FastWAM never
    # decodes)
    assert parts.vae.decoder is None and parts.vae.post_quant_conv is None
    assert sum(p.numel() for p in parts.vae.parameters()) == 54_222
    assert not parts.text_encoder.training and not parts.vae.training


@pytest.mark.numerics
def test_the_loss_and_its_parts_are_lerobots(policy, reference, meta) -> None:
    """LeRobot's training loss from its preprocessed batch, its noises and its shifted timesteps: the
    total and both parts (the lambdas applied), in train mode as lerobot-train runs it."""
    noise, time = _draws(reference)
    policy.train()
    try:
        loss, parts = policy.forward(_batch(reference, meta), noise=noise, time=time)
    finally:
        policy.eval()
    _close(loss, reference["loss.total"])
    _close(parts["loss_video"], torch.tensor(meta["loss_dict"]["loss_video"]))
    _close(parts["loss_action"], torch.tensor(meta["loss_dict"]["loss_action"]))


@pytest.mark.numerics
def test_the_task_gathered_as_bytes_gives_lerobots_loss(policy, reference, meta) -> None:
    """The engine's batches carry the task as UTF-8 bytes: the prompt is built in the policy."""
    batch = {**_batch(reference, meta), "task": task_bytes(meta["task"])}
    noise, time = _draws(reference)
    loss, _ = policy.forward(batch, noise=noise, time=time)
    _close(loss, reference["loss.total"])


@pytest.mark.numerics
def test_the_frozen_parts_encode_as_lerobots(policy, reference, meta) -> None:
    """The prompt's UMT5 embeddings with padding zeroed, the proprio token after them, and the VAE's
    standardized latents of the window (the intermediates that locate a mismatch)."""
    batch = _batch(reference, meta)
    context = policy.context(batch, torch.device("cpu"))
    _close(context, reference["loss.context"])
    latents = policy.frozen_parts(torch.device("cpu")).encode_video(policy.video(batch))
    _close(latents, reference["loss.input_latents"])


def test_the_vaes_decoder_is_never_read(policy, reference, meta, tmp_path: Path) -> None:
    """Only the VAE's encoder is read: a vae/ whose weights hold no decoder encodes LeRobot's latents,
    and one that lacks a tensor of the encoder is one line naming it."""
    from safetensors.torch import save_file

    from trainer.policies.fastwam import frozen

    source = Path(policy.frozen_directories["VAE"])
    weights = load_file(str(source / "diffusion_pytorch_model.safetensors"))
    encoder = {k: v for k, v in weights.items() if not k.startswith(("decoder.", "post_quant_conv."))}
    assert len(encoder) < len(weights)
    for name, kept in (("encoder_only", encoder), ("broken", dict(list(encoder.items())[1:]))):
        (tmp_path / name).mkdir()
        shutil.copy(source / "config.json", tmp_path / name / "config.json")
        save_file(kept, str(tmp_path / name / "diffusion_pytorch_model.safetensors"))
    directories = {**policy.frozen_directories, "VAE": tmp_path / "encoder_only"}
    parts = frozen.load(policy.config, directories, torch.device("cpu"), torch.float32)
    assert parts.vae.decoder is None
    _close(parts.encode_video(policy.video(_batch(reference, meta))), reference["loss.input_latents"])
    missing = next(iter(encoder))
    with pytest.raises(ConfigError, match=rf"^{tmp_path / 'broken'}: its weights lack {missing} ") as raised:
        frozen.load(
            policy.config, {**directories, "VAE": tmp_path / "broken"}, torch.device("cpu"), torch.float32
        )
    assert "\n" not in str(raised.value)


@pytest.mark.numerics
def test_each_task_is_encoded_once(policy, reference, meta) -> None:
    """The frozen UMT5 runs once per distinct prompt: a second batch of the same tasks (in another
    order) takes the kept embeddings, which are LeRobot's."""
    parts = policy.frozen_parts(torch.device("cpu"))
    parts.prompts.clear()
    calls = []
    hook = parts.text_encoder.register_forward_pre_hook(
        lambda _, args, kwargs: calls.append(kwargs["input_ids"].shape), with_kwargs=True
    )
    try:
        batch = _batch(reference, meta)
        first = policy.context(batch, torch.device("cpu"))
        again = policy.context({**batch, "task": batch["task"][::-1]}, torch.device("cpu"))
    finally:
        hook.remove()
    assert calls == [torch.Size([2, 32])] and len(parts.prompts) == 2
    _close(first, reference["loss.context"])
    assert torch.equal(again[:, :-1], first.flip(0)[:, :-1])


@pytest.mark.numerics
def test_the_text_encoder_is_released_before_training_with_the_same_loss(
    folder: Path, reference, meta
) -> None:
    """`prepare_tasks` (the engine's call before step 1) keeps each task's prompt embeddings and frees
    the frozen UMT5: nothing holds its parameters any more, and the loss is bit for bit the one computed
    with the encoder beside training."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        beside, released = (trainer.load_policy("pretrained_model").policy for _ in range(2))
    assert isinstance(beside, FastWAMPolicy) and isinstance(released, FastWAMPolicy)
    batch, (noise, time) = _batch(reference, meta), _draws(reference)
    expected, expected_parts = beside.forward(batch, noise=noise, time=time)

    cpu = torch.device("cpu")
    encoder = weakref.ref(released.frozen_parts(cpu).text_encoder)
    released.prepare_tasks(list(dict.fromkeys(meta["task"])), cpu)
    gc.collect()
    assert released.frozen_parts(cpu).text_encoder is None and encoder() is None
    loss, parts = released.forward(batch, noise=noise, time=time)
    assert released.frozen_parts(cpu).text_encoder is None  # every prompt was kept: never reloaded
    assert torch.equal(loss, expected)
    assert all(torch.equal(parts[k], expected_parts[k]) for k in ("loss_video", "loss_action"))


@pytest.mark.numerics
def test_the_action_chunk_is_lerobots(policy, reference, meta) -> None:
    """The chunk from the current frame with the initial noise drawn from `inference_seed` (or the noise
    given), and select_action serving it one step at a time."""
    observation = _observation(_batch(reference, meta))
    chunk = policy.predict_action_chunk(observation)
    _close(chunk, reference["actions.normalized"])
    given = policy.predict_action_chunk(observation, noise=reference["inference.noise"].expand(2, -1, -1))
    torch.testing.assert_close(
        given, chunk, atol=1e-6, rtol=1e-6
    )  # the seeded draw is that noise (to the bit on one ISA)
    other = policy.predict_action_chunk(observation, noise=torch.zeros(2, 8, 3))
    assert not torch.allclose(other, chunk, atol=1e-3)
    policy.reset()
    steps = [policy.select_action(observation) for _ in range(policy.config.n_action_steps)]
    _close(torch.stack(steps, dim=1), reference["actions.normalized"])
    policy.reset()


def test_the_processors_are_lerobots(folder: Path, reference) -> None:
    """The checkpoint's normalizer read by the engine's processor reader: the state and the action
    (x - mean) / (std + 1e-8) to the bit, the camera unchanged; the postprocessor gives LeRobot's
    unnormalized actions."""
    preprocessor, postprocessor = read_processors(folder / "pretrained_model")
    raw = {k.removeprefix("raw."): v for k, v in reference.items() if k.startswith("raw.")}
    raw[CAMERA] = raw.pop(f"{CAMERA}.uint8").float() / 255
    ours = preprocessor({k: raw[k] for k in ("observation.state", "action", CAMERA)})
    for key in ("observation.state", "action"):
        torch.testing.assert_close(ours[key], reference[f"pre.{key}"], atol=0, rtol=0)
    assert torch.equal(ours[CAMERA], raw[CAMERA])
    actions = postprocessor({"action": reference["actions.normalized"]})["action"]
    torch.testing.assert_close(actions, reference["actions.unnormalized"], atol=TOL, rtol=0)


def test_every_fsdp_unit_runs_its_forward(policy, reference, meta) -> None:
    """The units' forward() is what runs: each MoT layer twice in the loss (the video stream, then the
    action stream against its keys and values), in the prefill and at every Euler step; each projection
    inside it or inside an embedding; each expert's embedding and head; and every block weight belongs
    to one MoT layer."""
    units = [m for m in policy.modules() if type(m).__name__ in FastWAMPolicy._fsdp_wrap_modules]
    calls = {id(m): 0 for m in units}
    hooks = [
        m.register_forward_pre_hook(lambda m, *_: calls.__setitem__(id(m), calls[id(m)] + 1)) for m in units
    ]
    noise, time = _draws(reference)
    try:
        policy.forward(_batch(reference, meta), noise=noise, time=time)
        policy.predict_action_chunk(_observation(_batch(reference, meta)))
    finally:
        for hook in hooks:
            hook.remove()
    steps = policy.config.num_inference_steps
    by_class: dict[str, set[int]] = {}
    for m in units:
        by_class.setdefault(type(m).__name__, set()).add(calls[id(m)])
    projections = by_class.pop("Projection")
    assert projections and 0 not in projections
    assert by_class == {
        "MoTLayer": {3 + steps},
        "VideoExpert": {2},
        "ActionExpert": {1 + steps},
        "VideoHead": {1},
        "ActionHead": {1 + steps},
    }
    layers = [m for m in units if type(m).__name__ == "MoTLayer"]
    owned = {id(p) for m in layers for p in m.parameters()}
    in_layers = [p for n, p in policy.named_parameters() if ".layers." in n]
    assert len(layers) == 2 and in_layers and all(id(p) in owned for p in in_layers)


@pytest.mark.numerics
def test_gradient_checkpointing_recomputes_each_mot_layer_with_the_same_gradients(
    folder: Path, reference, meta, monkeypatch
) -> None:
    """`use_gradient_checkpointing` (and `mot_checkpoint_mixed_attn`) run every MoT layer again in the
    backward pass, the action stream's from the layer's video input (whose keys and values it computes
    again rather than keeping them); the loss and the gradients are those of the plain run."""
    monkeypatch.chdir(folder)
    noise, time = _draws(reference)
    grads, runs = [], []
    for flags in ({}, {"use_gradient_checkpointing": True}, {"mot_checkpoint_mixed_attn": True}):
        policy = trainer.load_policy("pretrained_model", **flags).policy
        policy.train()
        layers = [m for m in policy.modules() if type(m).__name__ == "MoTLayer"]
        calls: list[int] = []
        hooks = [m.register_forward_pre_hook(lambda *_, seen=calls: seen.append(1)) for m in layers]
        loss, _ = policy.forward(_batch(reference, meta), noise=noise, time=time)
        loss.backward()
        for hook in hooks:
            hook.remove()
        _close(loss.detach(), reference["loss.total"])
        grads.append({n: p.grad for n, p in policy.named_parameters()})
        runs.append(len(calls))
    # 2 layers, each run by the video stream, then the action stream; recomputed, the action stream's
    # layer first runs the video stream again to its keys and values, and each runs again backward
    assert runs == [4, 2 * (1 + 2) * 2, 2 * (1 + 2) * 2]
    for recomputed in grads[1:]:
        for name, grad in grads[0].items():
            torch.testing.assert_close(recomputed[name], grad, atol=1e-6, rtol=1e-5)


def test_a_frozen_video_expert_without_video_loss_runs_no_video_head(
    folder: Path, reference, meta, monkeypatch
) -> None:
    """freeze_video_expert with lambda_video=0 (LeRobot's recipe) neither runs the video head nor the
    last MoT layer's video block after its keys and values (the video loss is zero whatever they give):
    the loss and every trained gradient are those of the same weights with the video expert trained,
    where the whole video path runs."""
    monkeypatch.chdir(folder)
    noise, time = _draws(reference)
    loss_weights = {"lambda_video": 0.0, "lambda_action": 1.0}
    runs = []
    for freeze in (False, True):
        policy = trainer.load_policy("pretrained_model", freeze_video_expert=freeze, loss=loss_weights).policy
        policy.train()
        head = policy.model.mot.video.head
        calls: list[int] = []
        hook = head.register_forward_pre_hook(lambda *_, seen=calls: seen.append(1))
        loss, parts = policy.forward(_batch(reference, meta), noise=noise, time=time)
        loss.backward()
        hook.remove()
        grads = {n: p.grad for n, p in policy.named_parameters() if p.requires_grad}
        runs.append((loss.detach(), float(parts["loss_video"]), len(calls), grads))
    (trained_loss, _, trained_calls, trained_grads), (loss, video_part, calls, grads) = runs
    assert (trained_calls, calls, video_part) == (1, 0, 0.0)
    torch.testing.assert_close(loss, trained_loss, atol=0, rtol=0)
    assert grads and set(grads) < set(trained_grads)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, trained_grads[name], atol=1e-7, rtol=1e-6)


def test_bfloat16_runs_on_the_cpu_and_stays_near(folder: Path, reference, meta, monkeypatch) -> None:
    """LeRobot's default torch_dtype=bfloat16 does not run on a CPU (its float32 time embedding meets
    bfloat16 weights outside CUDA autocast); ours does, near the float32 reference."""
    monkeypatch.chdir(folder)
    policy = trainer.load_policy("pretrained_model", torch_dtype="bfloat16").policy
    assert {p.dtype for p in policy.parameters()} == {torch.bfloat16}
    noise, time = _draws(reference)
    loss, _ = policy.forward(_batch(reference, meta), noise=noise, time=time)
    chunk = policy.predict_action_chunk(_observation(_batch(reference, meta)))
    torch.testing.assert_close(loss, reference["loss.total"], atol=0.05, rtol=0.02)
    torch.testing.assert_close(chunk, reference["actions.normalized"], atol=0.1, rtol=0.05)


def test_lerobots_default_size_is_built() -> None:
    """At LeRobot's default size (built on meta): its 6,020,710,599 trainable parameters in 1,651 tensors,
    video expert 4,999,787,712, action expert 1,020,886,023, proprio encoder 36,864 (the fixture's count
    with LeRobot's own classes)."""
    from trainer.policies.fastwam.policy import FastWAM

    with torch.device("meta"):
        model = FastWAM(FastWAMConfig(base_model_id=None, action_dim=7, proprio_dim=8))
    state = model.state_dict()
    count = {
        part: sum(v.numel() for k, v in state.items() if part in k)
        for part in (".video", ".action", "proprio")
    }
    assert len(state) == 1651 and sum(v.numel() for v in state.values()) == 6_020_710_599
    assert count == {".video": 4_999_787_712, ".action": 1_020_886_023, "proprio": 36_864}


# A fresh FastWAM's tensors as LeRobot's classes start them, by name: (pattern, rule, expected std).
# "xavier": Wan's init_weights, uniform within sqrt(6 / (fan_in + fan_out)) (the patch embedding's over its
# flattened kernel); "torch": nn.Linear's own, uniform within 1 / sqrt(fan_in) (LeRobot's ActionDiT and
# proprio encoder keep it); "normal": Wan's text and time embeddings; "zero", "one": constant.
INITIAL = [
    (r"video\.head\.head\.(weight|bias)$", "zero"),
    (r"\.modulation$", "normal"),  # 1 / sqrt(hidden)
    (r"norm\w*\.weight$", "one"),
    (r"norm3\.bias$", "zero"),
    (r"video\.(text|time)_embedding\.\d\.weight$", "normal"),  # 0.02
    (r"video\.patch_embedding\.weight$", "xavier"),
    (r"video\.patch_embedding\.bias$", "torch"),  # the Conv3d's own (Wan re-draws the kernel only)
    (r"(mixtures\.video|blocks\.video)\..*\.weight$", "xavier"),
    (r"(mixtures\.video|blocks\.video)\..*\.bias$", "zero"),
    (r"(mixtures\.action\.|blocks\.action\.|proprio_encoder\.).*(weight|bias)$", "torch"),
]


def _initial_std(name: str, tensor: torch.Tensor, rule: str, hidden: dict[str, int], fan_in: int) -> float:
    if rule == "normal":
        return 0.02 if "embedding" in name else hidden["video" if "video" in name else "action"] ** -0.5
    if rule == "xavier":
        fan_out = tensor.shape[0]
        return (2 / (fan_in + fan_out)) ** 0.5
    return (3 * fan_in) ** -0.5  # torch's uniform within 1 / sqrt(fan_in)


def test_a_fresh_policy_starts_as_lerobots(monkeypatch: pytest.MonkeyPatch) -> None:
    """Built without weights, eagerly or on meta then materialized module by module (the engine's meta
    build calls each module's `reset_parameters()`), every tensor starts as LeRobot's classes start it
    (INITIAL): the video expert as Wan's `init_weights` leaves it (Xavier-uniform Linears with zero
    biases, its text and time embeddings normal(0, 0.02), the patch kernel Xavier-uniform over its
    flattened fan-in, a zero head), the action expert and the proprio encoder as torch's, the
    modulations normal(0, 1 / hidden)."""
    import re

    from trainer.policies.fastwam.policy import FastWAM

    sizes = {"num_heads": 2, "attn_head_dim": 128, "num_layers": 1, "text_dim": 64, "freq_dim": 64}
    config = FastWAMConfig(
        base_model_id=None, action_dim=7, proprio_dim=8, torch_dtype="float32",
        video_dit_config={**sizes, "hidden_dim": 256, "ffn_dim": 512},
        action_dit_config={**sizes, "hidden_dim": 128, "ffn_dim": 256},
    )  # fmt: skip
    hidden = {"video": 256, "action": 128}
    torch.manual_seed(0)
    eager = FastWAM(config)
    with torch.device("meta"):
        on_meta = FastWAM(config)
    for module in on_meta.modules():
        module.to_empty(device="cpu", recurse=False)
        if callable(getattr(module, "reset_parameters", None)):
            module.reset_parameters()
    for model in (eager, on_meta):
        fan_ins = {name: m.weight[0].numel() for name, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Conv3d))}  # fmt: skip
        for name, tensor in model.state_dict().items():
            rule = next((rule for pattern, rule in INITIAL if re.search(pattern, name)), None)
            assert rule is not None, f"{name}: no rule of INITIAL says how it starts"
            if rule in ("zero", "one"):
                assert torch.all(tensor == (rule == "one")), f"{name} should start {rule}"
                continue
            fan_in = fan_ins.get(name.rsplit(".", 1)[0], 0)  # of the Linear or Conv3d holding it
            expected = _initial_std(name, tensor, rule, hidden, fan_in)
            assert tensor.std().item() == pytest.approx(
                expected, rel=0.05 if tensor.numel() > 4000 else 0.2
            ), name
            if rule in ("xavier", "torch"):  # uniform: within sqrt(3) std
                assert tensor.abs().max().item() <= expected * 3**0.5 * (1 + 1e-6), name


def test_defaults_are_lerobots() -> None:
    """LeRobot 0.6.1's FastWAMConfig defaults, its window and its preset."""
    config = FastWAMConfig(base_model_id=None)
    assert (config.action_horizon, config.n_action_steps, config.num_video_frames) == (32, 32, 33)
    assert config.observation_delta_indices == list(range(0, 33, 4))
    assert config.action_delta_indices == list(range(32))
    assert config.image_size == (224, 448) and config.torch_dtype == "bfloat16"
    assert config.video_size().hidden_dim == 3072 and config.action_size().hidden_dim == 1024
    optimizer = config.get_optimizer_preset()
    assert (optimizer.lr, optimizer.weight_decay, optimizer.betas, optimizer.grad_clip_norm) == (
        1e-4, 1e-2, (0.9, 0.999), 10.0,
    )  # fmt: skip
    assert config.get_scheduler_preset().warmup_steps == 0


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"num_video_frames": 10}, r"^--policy.num_video_frames=10: num_video_frames - 1 must be a positive multiple"),
        ({"num_video_frames": 13, "action_video_freq_ratio": 4}, r"^--policy.num_video_frames=13 gives 4 model frames: the Wan VAE needs 4k \+ 1"),
        ({"action_horizon": 6, "n_action_steps": 6, "num_video_frames": 9, "action_video_freq_ratio": 2}, r"^--policy.action_horizon=6 must be a multiple"),
        ({"video_dit_config": {"hidden": 3}}, r"^--policy.video_dit_config: unknown key 'hidden'"),
        ({"action_dit_config": {"num_heads": 2}}, r"^--policy.video_dit_config and --policy.action_dit_config attend jointly"),
        ({"base_model_id": "lerobot/fastwam_base"}, r"^--policy.base_model_id=lerobot/fastwam_base: LeRobot starts"),
        ({"dtype": "float32"}, r"^--policy.dtype=float32: FastWAM's dtype is --policy.torch_dtype"),
    ],
)  # fmt: skip
def test_bad_configs_are_refused_in_one_line(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as raised:
        FastWAMConfig(**{"base_model_id": None, **fields})
    assert "\n" not in str(raised.value)


def _tiny(folder: Path) -> FastWAMConfig:
    saved = json.loads((folder / "pretrained_model" / "config.json").read_text())
    fields = FastWAMConfig.lerobot_adapter().config_from_lerobot(saved)
    return FastWAMConfig(**{k: v for k, v in fields.items() if k != "type"})


def test_frozen_parts_and_cameras_that_do_not_fit_are_refused_in_one_line(folder: Path, monkeypatch) -> None:
    """A text encoder or VAE that does not resolve names its field; cameras the width cannot be split
    between and a state of another width than the proprio encoder's are refused before anything is
    built."""
    monkeypatch.chdir(folder)
    config = _tiny(folder)
    with pytest.raises(ConfigError, match=r"^--policy.text_encoder_model_id=./nowhere: no such directory"):
        FastWAMPolicy(dataclasses.replace(config, text_encoder_model_id="./nowhere"))
    with pytest.raises(
        ConfigError, match=r"^--policy.tokenizer_model_id=./tiny_wan/vae: .* holds no tokenizer"
    ):
        FastWAMPolicy(dataclasses.replace(config, tokenizer_model_id="./tiny_wan/vae"))
    cameras = [f"observation.images.{name}" for name in "abcde"]
    with pytest.raises(
        ConfigError, match=r"^--policy.image_size=\[64, 96\]: its width 96 does not split into 5"
    ):
        FastWAMPolicy(dataclasses.replace(config, input_features=["observation.state", *cameras, "task"]))
    FastWAMPolicy(dataclasses.replace(config, input_features=["observation.state", *cameras[:3], "task"]))
    with pytest.raises(ConfigError, match=r"^--policy.proprio_dim=5, but the state has 6 values"):
        FastWAMPolicy(dataclasses.replace(config, obs_dim=6))


def test_freeze_video_expert_trains_the_action_expert_and_the_proprio_encoder_only(
    folder: Path, monkeypatch
) -> None:
    """LeRobot's `freeze_video_expert`: the video expert's embeddings, head and every layer's video block
    frozen, the action expert (23,947 here) and the proprio encoder (96) trained."""
    monkeypatch.chdir(folder)
    policy = FastWAMPolicy(dataclasses.replace(_tiny(folder), freeze_video_expert=True))
    trained = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert sum(p.numel() for p in policy.parameters() if p.requires_grad) == 23_947 + 96
    assert trained and not any(".video." in n or "mixtures.video" in n for n in trained)


def test_a_video_expert_that_does_not_fit_the_checkpoint_is_refused_in_one_line(
    folder: Path, monkeypatch
) -> None:
    monkeypatch.chdir(folder)
    config = _tiny(folder)
    video = {**(config.video_dit_config or {}), "ffn_dim": 96}
    policy = FastWAMPolicy(dataclasses.replace(config, video_dit_config=video))
    saved = load_file(str(folder / "pretrained_model" / "model.safetensors"))
    with pytest.raises(
        ConfigError,
        match=r"^--policy.path=elsewhere: its tensor model.mot.layers.0.blocks.video.ffn.0.bias is \[64\]",
    ) as raised:
        pretrained.fit_weights(policy, saved, "elsewhere")
    assert "\n" not in str(raised.value)


def test_the_gripper_toggle_is_lerobots_postprocessor_step(
    folder: Path, reference, meta, tmp_path: Path, monkeypatch
) -> None:
    """`toggle_action_dimensions` (LeRobot's LIBERO gripper toggle, a step of its postprocessor after
    the unnormalizer): each named dimension's acted value v becomes sign(1 - 2v), in turn, the others
    stay. A LeRobot checkpoint that sets it acts so here, and LeRobot's step is what an export of ours
    writes; a dimension outside the action is one line. That LeRobot's own step gives the same actions is
    `benchmarks/lerobot_side.py check`'s FastWAM row."""
    from trainer.data.pipeline.processors import Processor

    monkeypatch.chdir(folder)
    toggling = tmp_path / "toggling"
    shutil.copytree("pretrained_model", toggling)
    saved = json.loads((toggling / "config.json").read_text())
    (toggling / "config.json").write_text(json.dumps({**saved, "toggle_action_dimensions": [-1, 0]}))
    observation = _observation(_batch(reference, meta))
    actions = trainer.load_policy("pretrained_model").select_action(observation)
    loaded = trainer.load_policy(str(toggling))
    toggled = loaded.select_action(observation)
    assert torch.equal(toggled[:, 1], actions[:, 1])
    assert torch.equal(toggled[:, [0, 2]], torch.sign(1 - 2 * actions[:, [0, 2]]))
    values = torch.tensor([[0.2, 0.5, 0.9], [-3.0, 0.0, 0.5]])
    assert torch.equal(
        loaded.policy.finish_actions(values), torch.tensor([[1.0, 0.5, -1.0], [1.0, 0.0, 0.0]])
    )
    twice = trainer.load_policy("pretrained_model", toggle_action_dimensions=[1, 1]).policy
    assert torch.equal(twice.finish_actions(values)[:, 1], torch.tensor([1.0, -1.0]))  # 0.5->0->1, 0->1->-1

    # what `trainer export` writes for a checkpoint of ours (one in LeRobot's schema is copied as it is)
    adapter = loaded.config.lerobot_adapter()
    written, _ = Processor(loaded.postprocessor.steps, adapter.pipeline(loaded.config)).state()
    steps = written["steps"]
    assert [step["registry_name"] for step in steps] == [
        "unnormalizer_processor", "fastwam_action_toggle_processor", "device_processor"
    ]  # fmt: skip
    assert steps[1]["config"] == {"toggle_dimensions": [-1, 0]}
    assert adapter.config_to_lerobot(loaded.config)["toggle_action_dimensions"] == [-1, 0]
    with pytest.raises(
        ConfigError, match=r"^--policy.toggle_action_dimensions=\[3\]: 3 is no dimension"
    ) as raised:
        trainer.load_policy("pretrained_model", toggle_action_dimensions=[3])
    assert "\n" not in str(raised.value)


def test_export_gives_lerobots_files_back(folder: Path, tmp_path: Path, monkeypatch) -> None:
    """`trainer export` of LeRobot's checkpoint writes its config.json, its 139 tensors and its
    processor files back (as JSON, the statistics bit for bit): the schema both ways, nothing renamed.
    That LeRobot loads a fine-tuned export strictly and acts as ours is docs/fastwam.md's check."""
    from trainer.evaluation.lerobot_export import export_lerobot

    monkeypatch.chdir(folder)
    export_lerobot("pretrained_model", str(tmp_path / "export"))
    theirs, ours = folder / "pretrained_model", tmp_path / "export"
    for name in ("config.json", "policy_preprocessor.json", "policy_postprocessor.json"):
        assert json.loads((ours / name).read_text()) == json.loads((theirs / name).read_text()), name
    for name in ("model.safetensors", "policy_preprocessor_step_3_normalizer_processor.safetensors"):
        written, saved = load_file(str(ours / name)), load_file(str(theirs / name))
        assert written.keys() == saved.keys() and all(torch.equal(written[k], saved[k]) for k in saved), name
