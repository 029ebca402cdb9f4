"""pi0 and pi0.5 against what LeRobot 0.6.1 wrote and computed (tests/fixtures/lerobot_pi0_tiny,
tests/fixtures/lerobot_pi05_tiny).

The checkpoints name their tokenizer by the relative path `tiny_paligemma`, as LeRobot resolves it from
the working directory, and keep LeRobot's variant names, sized by `tiny_paligemma/tiny_pi_overrides.json`:
the tests run from a private copy of each fixture.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import trainer
from helpers.fixtures import copy_fixture
from trainer.errors import ConfigError
from trainer.policies.common import pretrained
from trainer.policies.pi import PI0Config, PI0Policy, PI05Config, PiPolicy
from trainer.policies.pi import weights as pi_weights
from trainer.policies.pi.layers import DecoderLayer, MLPProjection
from trainer.policies.pi.model import prefix_layout, suffix_layout

TOL = 1e-5  # LeRobot's reruns are bit-identical; its typical mistakes move the actions by 3e-3 or more
KINDS = ("pi0", "pi05")
REFERENCES = ("reference", "reference_padded_task")
OVERRIDES = "tiny_paligemma/tiny_pi_overrides.json"
CASES = [(kind, name) for kind in KINDS for name in REFERENCES]


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {kind: copy_fixture(tmp_path_factory.mktemp(kind), f"lerobot_{kind}_tiny") for kind in KINDS}


@pytest.fixture(scope="module")
def policies(fixtures: dict[str, Path]) -> dict[str, PiPolicy]:
    loaded = {}
    for kind, folder in fixtures.items():
        with pytest.MonkeyPatch.context() as patch:
            patch.chdir(folder)
            loaded[kind] = trainer.load_policy("pretrained_model", size_overrides=OVERRIDES).policy
    return loaded


def _reference(folder: Path, name: str) -> tuple[dict[str, torch.Tensor], dict]:
    return load_file(str(folder / f"{name}.safetensors")), json.loads((folder / f"{name}.json").read_text())


def _batch(reference: dict[str, torch.Tensor], prefix: str = "pre.") -> dict[str, torch.Tensor]:
    return {k.removeprefix(prefix): v for k, v in reference.items() if k.startswith(prefix)}


def _observation(reference: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in _batch(reference).items() if k not in ("action", "action_is_pad")}


def _close(ours: torch.Tensor, theirs: torch.Tensor, rtol: float = 0.0) -> None:
    torch.testing.assert_close(ours, theirs, atol=TOL, rtol=rtol)


def _processors(folder: Path):
    import ckpt_tools
    from trainer.data.pipeline.processors import Processor

    saved = ckpt_tools.load_processors(str(folder / "pretrained_model"))
    return [
        Processor.from_state(saved[name].config, saved[name].step_tensors)
        for name in ("policy_preprocessor", "policy_postprocessor")
    ]


@pytest.mark.parametrize("kind", KINDS)
def test_lerobots_checkpoint_loads_strictly_and_exports_back(policies, fixtures, kind: str) -> None:
    """Every tensor of model.safetensors is what the model holds (the lm_heads are read and dropped);
    exported under LeRobot's names, the model gives the same file back but the unused lm_heads."""
    saved = load_file(str(fixtures[kind] / "pretrained_model" / "model.safetensors"))
    assert len(saved) == {"pi0": 90, "pi05": 93}[kind]
    policy = policies[kind]
    assert len(policy.state_dict()) == len(saved) - 2
    exported = policy.config.lerobot_adapter().state_to_lerobot(policy.config, policy)
    assert exported.keys() == saved.keys()
    heads = (pi_weights.VLM_HEAD, pi_weights.EXPERT_HEAD)
    assert all(torch.equal(exported[k], saved[k]) for k in saved if k not in heads)
    assert torch.equal(exported[pi_weights.VLM_HEAD], saved[pi_weights.EMBED])
    assert not policy.training


@pytest.mark.parametrize("kind", KINDS)
def test_openpi_layout_keys_are_fixed_as_lerobot_fixes_them(policies, fixtures, kind: str) -> None:
    """A Hub checkpoint converted from openpi: no `model.` prefix, the time MLP under the other
    variant's name, pi0.5's stray state_proj, and the token embedding only as lm_head."""
    policy = policies[kind]
    saved = load_file(str(fixtures[kind] / "pretrained_model" / "model.safetensors"))
    openpi = {}
    for key, value in saved.items():
        if key == pi_weights.EMBED:
            continue
        if key == pi_weights.VLM_HEAD:
            value = saved[pi_weights.EMBED]
        key = key.removeprefix("model.")
        for ours, theirs in (("action_time_mlp_", "time_mlp_"), ("time_mlp_", "action_time_mlp_")):
            if key.startswith(ours):
                key = theirs + key.removeprefix(ours)
                break
        openpi[key] = value
    if kind == "pi05":
        openpi["state_proj.weight"] = torch.zeros(16, 32)
    fixed = policy.config.lerobot_adapter().state_from_lerobot(openpi)
    ours = policy.state_dict()
    assert fixed.keys() == ours.keys()
    assert all(torch.equal(fixed[k], ours[k]) for k in ours)


@pytest.mark.parametrize(("kind", "name"), CASES)
def test_prompt_tokens_masks_and_positions_are_lerobots(policies, fixtures, kind: str, name: str) -> None:
    """The prompt text and its tokens from the task strings (pi0.5: and the normalized state), the
    prefix's pad mask, and every attention mask and position id of the three passes, exactly."""
    reference, meta = _reference(fixtures[kind], name)
    pre = _batch(reference)
    policy = policies[kind]
    state = pre["observation.state"]
    assert policy.tokenizer.prompts(meta["task"], state) == meta["prompt"]["text_fed_to_tokenizer"]
    tokens, mask = policy.tokenizer(meta["task"], state)
    assert torch.equal(tokens, pre["observation.language.tokens"])
    assert torch.equal(mask, pre["observation.language.attention_mask"])
    _, pad, block = policy.prefix(_observation(reference))
    assert torch.equal(pad, reference["inference.prefix_pad_masks"])
    assert torch.equal(block, reference["inference.prefix_att_masks"])
    prefill_mask, prefill_positions = prefix_layout(pad, block)
    assert torch.equal(prefill_mask, reference["inference.prefix_att_2d_masks"])
    assert torch.equal(prefill_positions, reference["inference.prefix_position_ids"])
    state = policy.padded_state(pre)
    (_, suffix_pad, suffix_block), _ = policy.model.embed_suffix(
        state, reference["noise"], reference["loss.time"]
    )
    step_mask, step_positions = suffix_layout(pad, suffix_pad, suffix_block)
    assert torch.equal(step_mask, reference["inference.suffix_att_2d_masks"])
    assert torch.equal(step_positions, reference["inference.suffix_position_ids"])
    # the loss: LeRobot's one pass over [prefix; suffix] is ours in two, the prefix's (its rows see no
    # suffix key) and the suffix's against the prefix's keys and values
    n = pad.shape[1]
    joint_mask, joint_positions = reference["loss.att_2d_masks"], reference["loss.position_ids"]
    assert torch.equal(joint_mask[:, :n, :n], prefill_mask) and not joint_mask[:, :n, n:].any()
    assert torch.equal(joint_mask[:, n:], step_mask)
    assert torch.equal(joint_positions, torch.cat([prefill_positions, step_positions], dim=1))


@pytest.mark.parametrize(("kind", "name"), CASES)
def test_actions_and_loss_are_lerobots(policies, fixtures, kind: str, name: str) -> None:
    reference, _ = _reference(fixtures[kind], name)
    policy = policies[kind]
    actions = policy.predict_action_chunk(_observation(reference), noise=reference["noise"])
    _close(actions, reference["actions.normalized"])
    _, postprocessor = _processors(fixtures[kind])
    _close(postprocessor({"action": actions})["action"], reference["actions.unnormalized"])
    batch, noise, time = _batch(reference), reference["loss.noise"], reference["loss.time"]
    loss, metrics = policy.forward(batch, noise=noise, time=time)
    _close(loss, reference["loss.mean"])
    per_sample, _ = policy.forward(batch, noise=noise, time=time, reduction="none")
    _close(per_sample, reference["loss.per_sample"])
    padded = reference["loss.actions_padded"]
    _close(
        policy.elementwise_losses(batch, padded, noise, time), reference["loss.losses_elementwise"], rtol=TOL
    )
    _close(
        metrics["loss_per_dim"],
        torch.tensor(_reference(fixtures[kind], name)[1]["loss_dict"]["loss_per_dim"]),
    )


@pytest.mark.parametrize("kind", KINDS)
def test_intermediates_are_lerobots(policies, fixtures, kind: str) -> None:
    """Where a mismatch would start: the images fed to SigLIP and their tokens, the prefix
    embeddings, the prefix's cached keys and values (at valid positions), each Euler step's suffix
    embeddings, pi0.5's adaRMS condition, the expert's output and the velocity."""
    reference, _ = _reference(fixtures[kind], "reference_padded_task")
    policy = policies[kind]
    observation = _observation(reference)
    images, _ = policy.images(observation)
    for camera, image in zip(policy.features.cameras, images, strict=True):
        assert torch.equal(image, reference[f"inference.image_in.{camera}"])
        _close(
            policy.model.paligemma_with_expert.embed_image(image), reference[f"inference.image_emb.{camera}"]
        )
    prefix = policy.prefix(observation)
    valid = reference["inference.prefix_pad_masks"]
    _close(prefix[0][valid], reference["inference.prefix_embs"][valid])
    with torch.no_grad():
        cache = policy.model.prefill(prefix)
        for i, (keys, values) in enumerate(cache):
            _close(keys[valid], reference[f"inference.prefix_kv.layer{i}.keys"].transpose(1, 2)[valid])
            _close(values[valid], reference[f"inference.prefix_kv.layer{i}.values"].transpose(1, 2)[valid])
        state = policy.padded_state(observation)
        for step in range(policy.config.num_inference_steps):
            x_t, time = reference[f"inference.step{step}.x_t"], reference[f"inference.step{step}.time"]
            (suffix, _, _), cond = policy.model.embed_suffix(state, x_t, time)
            _close(suffix, reference[f"inference.step{step}.suffix_embs"])
            if kind == "pi05":
                _close(cond, reference[f"inference.step{step}.adarms_cond"])
            out = policy.model.denoise(prefix, cache, state, x_t, time)
            _close(out, reference[f"inference.step{step}.expert_out"])
            _close(policy.model.velocity(out), reference[f"inference.step{step}.v_t"])


@pytest.mark.parametrize("kind", KINDS)
def test_preprocessing_of_the_raw_batch_is_lerobots(fixtures, kind: str) -> None:
    """The checkpoint's normalizer read by the engine's processor reader: pi0's MEAN_STD
    (x - mean) / (std + 1e-8) to the bit, pi0.5's QUANTILES as an affine map to float rounding;
    cameras kept on [0, 1]."""
    reference, _ = _reference(fixtures[kind], "reference")
    pre, raw = _batch(reference), _batch(reference, "raw.")
    preprocessor, _ = _processors(fixtures[kind])
    keys = ("observation.state", "action", "observation.images.top", "observation.images.wrist")
    ours = preprocessor({k: raw[k] for k in keys})
    for key in keys:
        torch.testing.assert_close(ours[key], pre[key], atol=1e-6 if kind == "pi05" else 0, rtol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_the_task_gathered_as_bytes_gives_lerobots_loss(policies, fixtures, kind: str) -> None:
    """The engine's batches carry the task as UTF-8 bytes (`task`): the prompt is built and tokenized
    in the policy (pi0.5's from the batch's normalized state)."""
    from trainer.data.dataset import task_bytes

    reference, meta = _reference(fixtures[kind], "reference_padded_task")
    batch = {k: v for k, v in _batch(reference).items() if not k.startswith("observation.language")}
    batch["task"] = task_bytes(meta["task"])
    loss, _ = policies[kind].forward(batch, noise=reference["loss.noise"], time=reference["loss.time"])
    _close(loss, reference["loss.mean"])


@pytest.mark.parametrize("kind", KINDS)
def test_every_fsdp_unit_runs_its_forward(policies, fixtures, kind: str) -> None:
    """The FSDP units' forward() is what runs: each decoder layer (PaliGemma's in the loss and the
    prefill, the expert's in the loss and at every Euler step) and its MLP's projections, each SigLIP
    encoder layer, the embeddings and every norm, and every decoder weight belongs to exactly one
    decoder layer."""
    policy = policies[kind]
    reference, _ = _reference(fixtures[kind], "reference")
    units = [m for m in policy.modules() if type(m).__name__ in PiPolicy._fsdp_wrap_modules]
    calls = {id(m): 0 for m in units}
    hooks = [
        m.register_forward_pre_hook(lambda m, _: calls.__setitem__(id(m), calls[id(m)] + 1)) for m in units
    ]
    try:
        policy.forward(_batch(reference), noise=reference["loss.noise"], time=reference["loss.time"])
        policy.predict_action_chunk(_observation(reference), noise=reference["noise"])
    finally:
        for hook in hooks:
            hook.remove()
    by_class: dict[str, set[int]] = {}
    for m in units:
        by_class.setdefault(type(m).__name__, set()).add(calls[id(m)])
    steps, cameras = policy.config.num_inference_steps, len(policy.features.cameras)
    # PaliGemma's layers in the loss and the prefill, the expert's also at each Euler step; SigLIP once
    # per camera in the loss and the prefill
    layers = {name: m for name, m in policy.named_modules() if isinstance(m, DecoderLayer)}
    for stream, runs in (("paligemma", 2), ("expert", 1 + steps)):
        assert {calls[id(m)] for name, m in layers.items() if name.endswith(stream)} == {runs}
    assert by_class.pop("DecoderLayer") == {2, 1 + steps}
    # each MLP projection with its layer, but the idle last PaliGemma layer's, which nothing reads
    projections = {name: calls[id(m)] for name, m in policy.named_modules() if isinstance(m, MLPProjection)}
    last = f"layers.{len(layers) // 2 - 1}.paligemma.mlp."
    assert {runs for name, runs in projections.items() if last in name} == {0}
    assert by_class.pop("MLPProjection") == {0, 2, 1 + steps}
    assert by_class.pop("SiglipEncoderLayer") == by_class.pop("SiglipVisionEmbeddings") == {2 * cameras}
    assert by_class.pop("GemmaTextScaledWordEmbedding") == {2}
    # the norms of the layers' streams and the expert's final norm: each at least once per pass
    assert set(by_class) == {"PiRMSNorm"} and min(by_class["PiRMSNorm"]) >= 2
    in_units = [n for n, _ in policy.named_parameters() if ".layers." in n and "vision_tower" not in n]
    owned = {id(p) for m in layers.values() for p in m.parameters()}
    assert in_units and all(id(p) in owned for n, p in policy.named_parameters() if n in in_units)


def test_lerobots_default_sizes_are_built() -> None:
    """At LeRobot's default sizes (gemma_2b + gemma_300m, 224x224; built on the meta device) the
    parameter counts are LeRobot's without its two unused lm_heads (the fixtures' tensors.txt)."""
    from trainer.policies.pi.model import PiFlowModel

    for config, total in ((PI0Config(), 3_238_048_528), (PI05Config(), 3_353_433_872)):
        with torch.device("meta"):
            model = PiFlowModel(config, config.sizes())
        assert sum(p.numel() for p in model.parameters()) == total


def test_defaults_are_lerobots() -> None:
    pi0, pi05 = PI0Config(), PI05Config()
    assert (pi0.paligemma_variant, pi0.action_expert_variant, pi0.dtype) == (
        "gemma_2b",
        "gemma_300m",
        "float32",
    )
    assert (pi0.chunk_size, pi0.n_action_steps, pi0.max_state_dim, pi0.max_action_dim) == (50, 50, 32, 32)
    assert (pi0.num_inference_steps, pi0.image_resolution, pi0.tokenizer_max_length) == (10, (224, 224), 48)
    assert (pi0.time_sampling_beta_alpha, pi0.time_sampling_beta_beta) == (1.5, 1.0)
    assert (pi0.time_sampling_scale, pi0.time_sampling_offset, pi0.min_period, pi0.max_period) == (
        0.999,
        0.001,
        4e-3,
        4.0,
    )
    assert (pi0.optimizer_lr, pi0.optimizer_betas, pi0.optimizer_weight_decay) == (2.5e-5, (0.9, 0.95), 0.01)
    assert (pi0.scheduler_warmup_steps, pi0.scheduler_decay_steps, pi0.scheduler_decay_lr) == (
        1000,
        30000,
        2.5e-6,
    )
    assert not (pi0.freeze_vision_encoder or pi0.train_expert_only or pi0.gradient_checkpointing)
    assert pi0.tokenizer_name == "google/paligemma-3b-pt-224" and pi0.size_overrides is None
    assert pi0.normalization_mapping == {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"}
    assert pi05.normalization_mapping == {"VISUAL": "IDENTITY", "STATE": "QUANTILES", "ACTION": "QUANTILES"}
    assert pi05.tokenizer_max_length == 200 and pi05.pi05 and not pi0.pi05


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"paligemma_variant": "gemma_7b"}, r"^--policy.paligemma_variant='gemma_7b' is not a LeRobot variant: choose one of gemma_300m, gemma_2b$"),
        ({"action_expert_variant": "gemma_1b"}, r"^--policy.action_expert_variant='gemma_1b' is not a LeRobot variant"),
        ({"image_resolution": (225, 225)}, r"^--policy.image_resolution=\[225, 225\] is not a multiple of SigLIP's patch size 14: give a multiple of 14"),
        ({"image_resolution": (224, 256)}, r"^--policy.image_resolution=\[224, 256\]: PaliGemma takes square images"),
        ({"dtype": "float16"}, r"^--policy.dtype='float16': choose one of bfloat16, float32$"),
        ({"n_action_steps": 51}, r"^--policy.n_action_steps=51 must be in \[1, --policy.chunk_size=50\]$"),
        ({"normalization_mapping": {"STATE": "MIN_MAX"}}, r"^--policy.normalization_mapping=.*each mode must be one of IDENTITY, MEAN_STD, QUANTILES$"),
        ({"size_overrides": "absent.json"}, r"^--policy.size_overrides=absent.json: cannot read it \(No such file or directory\)"),
    ],
)  # fmt: skip
def test_bad_configs_are_refused_in_one_line(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as raised:
        PI0Config(**fields)
    assert "\n" not in str(raised.value)


def test_size_overrides_are_checked(fixtures, tmp_path: Path) -> None:
    """The overrides' patch size governs the image check; a file with an unknown key is one line."""
    overrides = fixtures["pi0"] / OVERRIDES
    with pytest.raises(
        ConfigError, match=r"is not a multiple of SigLIP's patch size 8: give a multiple of 8"
    ):
        PI0Config(size_overrides=str(overrides), image_resolution=(36, 36))
    assert PI0Config(size_overrides=str(overrides), image_resolution=(40, 40)).sizes().vision.patch_size == 8
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"gemma_variants": {}, "hidden": 3}))
    with pytest.raises(
        ConfigError, match=r"^--policy.size_overrides=.*bad.json: unexpected 'hidden'; it may set"
    ):
        PI0Config(size_overrides=str(bad))


def test_a_missing_tokenizer_is_refused_in_one_line(fixtures, tmp_path: Path, monkeypatch) -> None:
    config = PI0Config(
        size_overrides=str(fixtures["pi0"] / OVERRIDES),
        image_resolution=(32, 32),
        input_features=["observation.state", "observation.images.top", "task"],
        obs_dim=4,
        action_dim=2,
    )
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        ConfigError, match=r"^--policy.tokenizer_name=nowhere: no such directory \(a relative path"
    ):
        PI0Policy(dataclasses.replace(config, tokenizer_name="nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(
        ConfigError, match=r"^--policy.tokenizer_name=empty: empty holds no tokenizer \(tokenizer.json\)"
    ):
        PI0Policy(dataclasses.replace(config, tokenizer_name="empty"))


@pytest.mark.parametrize("kind", KINDS)
def test_bfloat16_keeps_lerobots_float32_parts_and_stays_near(fixtures, kind: str, monkeypatch) -> None:
    """--policy.dtype=bfloat16 as LeRobot casts it: the Gemma layers in bfloat16, SigLIP, the projector,
    every norm and the projections in float32; the results near the float32 reference (LeRobot's own
    bfloat16 run moves the actions by ~3e-3)."""
    monkeypatch.chdir(fixtures[kind])
    policy = trainer.load_policy("pretrained_model", size_overrides=OVERRIDES, dtype="bfloat16").policy
    float32 = ("vision_tower", "multi_modal_projector", "layernorm", "model.norm")
    for name, param in policy.named_parameters():
        kept = not name.startswith("model.paligemma_with_expert.") or any(part in name for part in float32)
        assert param.dtype == (torch.float32 if kept else torch.bfloat16), name
    reference, _ = _reference(fixtures[kind], "reference")
    loss, _ = policy.forward(_batch(reference), noise=reference["loss.noise"], time=reference["loss.time"])
    actions = policy.predict_action_chunk(_observation(reference), noise=reference["noise"])
    torch.testing.assert_close(loss, reference["loss.mean"], atol=0.05, rtol=0.02)
    torch.testing.assert_close(actions, reference["actions.normalized"], atol=0.05, rtol=0.02)


def test_a_checkpoint_of_another_model_is_refused_in_one_line(policies, fixtures) -> None:
    """pi0.5's weights into pi0 (no state_proj, adaRMS norms): the first missing tensor named, nothing
    loaded; LeRobot itself only prints a warning and keeps the random model."""
    policy = policies["pi0"]
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    pi05 = load_file(str(fixtures["pi05"] / "pretrained_model" / "model.safetensors"))
    with pytest.raises(
        ConfigError,
        match=r"^--policy.path=elsewhere: its weights do not fit the PI0Policy built from the flags",
    ) as raised:
        pretrained.fit_weights(policy, pi05, "elsewhere")
    assert "\n" not in str(raised.value)
    assert all(torch.equal(before[k], v) for k, v in policy.state_dict().items())


def test_quantiles_without_their_statistics_are_refused_in_one_line(fixtures) -> None:
    import ckpt_tools
    from trainer.data.pipeline.processors import Processor

    saved = ckpt_tools.load_processors(str(fixtures["pi05"] / "pretrained_model"))["policy_preprocessor"]
    tensors = [{k: v for k, v in step.items() if not k.endswith(".q99")} for step in saved.step_tensors]
    with pytest.raises(ConfigError, match=r"^its processor step 3 has no observation.state.q01/q99 tensor"):
        Processor.from_state(saved.config, tensors)
