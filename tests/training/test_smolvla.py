"""SmolVLA against what LeRobot 0.6.1 wrote and computed (tests/fixtures/lerobot_smolvla_tiny).

The checkpoint names its backbone by the relative path `tiny_smolvlm`, as LeRobot resolves it from
the working directory: the tests run from a private copy of the fixture.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import draccus
import pytest
import torch
from safetensors.torch import load_file

from helpers.fixtures import copy_fixture
from helpers.smolvlm_sizes import write_smolvlm2_500m
from trainer.config.policy import PolicyConfig
from trainer.errors import ConfigError
from trainer.evaluation.lerobot_export import export_lerobot
from trainer.policies import upgrade_policy_config
from trainer.policies.smolvla import SmolVLAConfig

# The references are LeRobot's float32 results on the CPU that made them; ours are another rounding of
# the same function (other kernels, another instruction set: AVX-512, AVX2, ATen's plain loops). The
# fixture's README measured LeRobot's own recomputations at up to 2.4e-7 (actions) and 9.5e-7
# (element-wise losses) under another thread count or attention kernel: 1-4 ulps of the largest values
# (actions up to 1.73, loss 2.22; their ulp is 1.2e-7 and 2.4e-7). A network of this depth (a dozen layers
# of dot products of at most 128 terms, 3 Euler steps) carries first-order rounding of order its depth
# times U = 2**-24 times the magnitudes involved, ~1e-6; TOL = 1e-5 (40 ulps of the loss) leaves a
# margin of 10 over that on any CPU, and a real difference (a mask, the RoPE base, the padding side)
# shows at 1e-2 or more.
TOL = 1e-5
REFERENCES = ("reference", "reference_padded_task")


@pytest.fixture(scope="module")
def fixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_fixture(tmp_path_factory.mktemp("smolvla"), "lerobot_smolvla_tiny")


@pytest.fixture
def loaded(fixture: Path, monkeypatch: pytest.MonkeyPatch):
    import trainer

    monkeypatch.chdir(fixture)
    return trainer.load_policy("pretrained_model")


def _reference(fixture: Path, name: str) -> tuple[dict[str, torch.Tensor], dict]:
    return load_file(str(fixture / f"{name}.safetensors")), json.loads((fixture / f"{name}.json").read_text())


def _batch(reference: dict[str, torch.Tensor], prefix: str = "pre.") -> dict[str, torch.Tensor]:
    return {k.removeprefix(prefix): v for k, v in reference.items() if k.startswith(prefix)}


def test_lerobots_checkpoint_loads_strictly(loaded, fixture: Path) -> None:
    saved = load_file(str(fixture / "pretrained_model" / "model.safetensors"))
    ours = loaded.policy.state_dict()
    assert len(saved) == 124
    assert {k: tuple(v.shape) for k, v in ours.items()} == {k: tuple(v.shape) for k, v in saved.items()}
    assert all(torch.equal(ours[k], saved[k]) for k in saved)
    assert not loaded.policy.training


@pytest.mark.numerics
@pytest.mark.parametrize("name", REFERENCES)
def test_actions_and_loss_are_lerobots(loaded, fixture: Path, name: str) -> None:
    reference, _ = _reference(fixture, name)
    batch = _batch(reference)
    observation = {k: v for k, v in batch.items() if k not in ("action", "action_is_pad")}
    actions = loaded.policy.predict_action_chunk(observation, noise=reference["noise"])
    torch.testing.assert_close(actions, reference["actions.normalized"], atol=TOL, rtol=0)
    unnormalized = loaded.postprocessor({"action": actions})["action"]
    torch.testing.assert_close(unnormalized, reference["actions.unnormalized"], atol=TOL, rtol=0)
    noise, time = reference["loss.noise"], reference["loss.time"]
    loss, _ = loaded.policy.forward(batch, noise=noise, time=time)
    torch.testing.assert_close(loss, reference["loss.mean"], atol=TOL, rtol=0)
    per_sample, _ = loaded.policy.forward(batch, noise=noise, time=time, reduction="none")
    torch.testing.assert_close(per_sample, reference["loss.per_sample"], atol=TOL, rtol=0)


@pytest.mark.numerics
@pytest.mark.parametrize("name", REFERENCES)
def test_preprocessing_of_the_raw_batch_is_lerobots(loaded, fixture: Path, name: str) -> None:
    """Tokens and masks from the task strings exactly; state and action normalized as LeRobot's
    normalizer does (std + 1e-8), cameras kept on [0, 1]."""
    reference, meta = _reference(fixture, name)
    pre, raw = _batch(reference), _batch(reference, "raw.")
    tokens, mask = loaded.policy.tokenizer(meta["task"])
    assert torch.equal(tokens, pre["observation.language.tokens"])
    assert torch.equal(mask, pre["observation.language.attention_mask"])
    keys = ("observation.state", "action", "observation.images.top", "observation.images.wrist")
    ours = loaded.preprocessor({k: raw[k] for k in keys})
    for key in keys:
        # the same float operations as LeRobot's, element by element ((x - mean) / (std + 1e-8), images
        # unchanged): each one correctly rounded under IEEE 754 on any CPU and instruction set (no sum
        # whose order a kernel picks), so equal bit for bit to the stored ones
        assert torch.equal(ours[key], pre[key]), key


@pytest.mark.numerics
def test_the_task_gathered_as_bytes_gives_the_same_loss(loaded, fixture: Path) -> None:
    """The engine's batches carry the task as UTF-8 bytes (`task`): tokenized in the policy."""
    from trainer.data.dataset import task_bytes

    reference, meta = _reference(fixture, "reference_padded_task")
    batch = _batch(reference)
    batch = {k: v for k, v in batch.items() if not k.startswith("observation.language")}
    batch["task"] = task_bytes(meta["task"])
    loss, _ = loaded.policy.forward(batch, noise=reference["loss.noise"], time=reference["loss.time"])
    torch.testing.assert_close(loss, reference["loss.mean"], atol=TOL, rtol=0)


def test_config_json_is_lerobots_schema_and_round_trips(fixture: Path) -> None:
    lerobot = json.loads((fixture / "pretrained_model" / "config.json").read_text())
    config = draccus.decode(PolicyConfig, upgrade_policy_config(lerobot))
    assert isinstance(config, SmolVLAConfig)
    assert config.to_dict() == lerobot  # every field, LeRobot's order of features included
    again = draccus.decode(PolicyConfig, upgrade_policy_config(config.to_dict()))
    assert again == config


def test_the_export_for_lerobot_is_lerobots_checkpoint_again(
    fixture: Path, monkeypatch, tmp_path: Path
) -> None:
    """`trainer export` on a SmolVLA writes what its pretrained_model/ holds: LeRobot's names already."""
    monkeypatch.chdir(fixture)
    export_lerobot("pretrained_model", str(tmp_path / "out"))
    saved = load_file(str(fixture / "pretrained_model" / "model.safetensors"))
    exported = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert exported.keys() == saved.keys() and all(torch.equal(exported[k], t) for k, t in saved.items())
    config = (tmp_path / "out" / "config.json").read_text()
    assert json.loads(config) == json.loads((fixture / "pretrained_model" / "config.json").read_text())


def test_defaults_are_lerobots() -> None:
    config = SmolVLAConfig()
    assert {
        name: getattr(config, name)
        for name in (
            "chunk_size", "n_action_steps", "max_state_dim", "max_action_dim", "resize_imgs_with_padding",
            "tokenizer_max_length", "num_steps", "use_cache", "freeze_vision_encoder", "train_expert_only",
            "train_state_proj", "optimizer_lr", "optimizer_betas", "optimizer_eps", "optimizer_weight_decay",
            "optimizer_grad_clip_norm", "scheduler_warmup_steps", "scheduler_decay_steps", "scheduler_decay_lr",
            "vlm_model_name", "load_vlm_weights", "add_image_special_tokens", "attention_mode", "prefix_length",
            "pad_language_to", "num_expert_layers", "num_vlm_layers", "self_attn_every_n_layers",
            "expert_width_multiplier", "min_period", "max_period",
        )
    } == {
        "chunk_size": 50, "n_action_steps": 50, "max_state_dim": 32, "max_action_dim": 32,
        "resize_imgs_with_padding": (512, 512), "tokenizer_max_length": 48, "num_steps": 10, "use_cache": True,
        "freeze_vision_encoder": True, "train_expert_only": True, "train_state_proj": True, "optimizer_lr": 1e-4,
        "optimizer_betas": (0.9, 0.95), "optimizer_eps": 1e-8, "optimizer_weight_decay": 1e-10,
        "optimizer_grad_clip_norm": 10, "scheduler_warmup_steps": 1000, "scheduler_decay_steps": 30000,
        "scheduler_decay_lr": 2.5e-6, "vlm_model_name": "HuggingFaceTB/SmolVLM2-500M-Video-Instruct",
        "load_vlm_weights": False, "add_image_special_tokens": False, "attention_mode": "cross_attn",
        "prefix_length": -1, "pad_language_to": "longest", "num_expert_layers": -1, "num_vlm_layers": 16,
        "self_attn_every_n_layers": 2, "expert_width_multiplier": 0.75, "min_period": 4e-3, "max_period": 4.0,
    }  # fmt: skip


def test_trainable_parameters_are_lerobots(loaded) -> None:
    """train_expert_only (LeRobot's default): the expert, the projections and the time MLP train,
    194,976 parameters of 421,120 as LeRobot reports for this checkpoint."""
    loaded.policy.train()
    params = list(loaded.policy.parameters())
    assert sum(p.numel() for p in params) == 421_120
    assert sum(p.numel() for p in params if p.requires_grad) == 194_976
    assert not loaded.policy.model.vlm_with_expert.vlm.training  # frozen parts stay in eval mode


def test_a_wider_state_than_max_state_dim_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"the state has 40 values, more than --policy.max_state_dim=32"):
        SmolVLAConfig(obs_dim=40)


def test_a_task_longer_than_tokenizer_max_length_is_truncated_as_lerobot_does(loaded) -> None:
    """LeRobot's tokenizer step truncates (truncation=True, max_length=tokenizer_max_length): a
    LeRobot checkpoint acts the same here on the same long instruction."""
    tokens, mask = loaded.policy.tokenizer(["reach the corner " * 40, "push"])
    assert tokens.shape == (2, 48) and mask[0].all() and mask[1].sum() < 48


def test_the_default_size_has_lerobots_parameter_count(tmp_path: Path) -> None:
    """LeRobot's defaults on SmolVLM2-500M, built on the meta device: 450,046,176 parameters
    (402,737,376 without the unused lm_head), as LeRobot's own SmolVLAPolicy counts them."""
    from trainer.policies.common.base import build_policy

    backbone = write_smolvlm2_500m(tmp_path / "smolvlm2_500m")
    features = ["observation.state", "observation.images.top", "task"]
    with torch.device("meta"):
        policy = build_policy(SmolVLAConfig(vlm_model_name=str(backbone), input_features=features), 6, 6)
    total = sum(p.numel() for p in policy.parameters())
    assert total == 450_046_176
    assert total - policy.model.vlm_with_expert.vlm.lm_head.weight.numel() == 402_737_376


@pytest.mark.numerics
def test_a_bfloat16_policy_runs_and_stays_near_float32(loaded, fixture: Path) -> None:
    """--policy.dtype=bfloat16 casts the parameters: inputs enter in that dtype, attention and the
    velocity head are still computed as in float32 LeRobot, the results near the float32 ones."""
    import copy

    reference, _ = _reference(fixture, "reference")
    batch = _batch(reference)
    policy = copy.deepcopy(loaded.policy).to(torch.bfloat16)
    loss, _ = policy.forward(batch, noise=reference["loss.noise"], time=reference["loss.time"])
    actions = policy.predict_action_chunk(batch, noise=reference["noise"])
    assert loss.dtype == actions.dtype == torch.bfloat16
    torch.testing.assert_close(loss.float(), reference["loss.mean"], atol=0.05, rtol=0.02)
    torch.testing.assert_close(actions.float(), reference["actions.normalized"], atol=0.1, rtol=0.05)


@pytest.mark.numerics
def test_empty_cameras_add_blank_masked_slots_as_lerobot_does(loaded, fixture: Path) -> None:
    """LeRobot's `empty_cameras=N` puts N blank slots (-1, padding mask false) after the real cameras;
    masked out, they leave the actions unchanged. Its saved empty_camera_i features are not cameras
    the data must give."""
    import copy

    reference, _ = _reference(fixture, "reference")
    batch = {k: v for k, v in _batch(reference).items() if k not in ("action", "action_is_pad")}
    policy = copy.deepcopy(loaded.policy)
    policy.config = dataclasses.replace(policy.config, empty_cameras=1)
    images, masks = policy._images(batch)
    assert len(images) == 3 and bool((images[2] == -1).all()) and not masks[2].any()
    actions = policy.predict_action_chunk(batch, noise=reference["noise"])
    torch.testing.assert_close(actions, reference["actions.normalized"], atol=TOL, rtol=0)
    saved = json.loads((fixture / "pretrained_model" / "config.json").read_text())
    saved["input_features"]["observation.images.empty_camera_0"] = {"type": "VISUAL", "shape": [3, 480, 640]}
    assert "observation.images.empty_camera_0" not in upgrade_policy_config(saved)["input_features"]


def test_a_hub_id_backbone_is_read_through_the_hf_cache_offline(
    fixture: Path, tmp_path: Path, monkeypatch
) -> None:
    """`--policy.vlm_model_name=<repo id>` as LeRobot reads it: the snapshot in the Hugging Face cache
    (here offline); a repo id the cache lacks is one line."""
    from helpers.hf_cache import put_in_hub_cache
    from trainer.policies.common.vla.hub import resolve_pretrained

    cache = tmp_path / "hub"
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    put_in_hub_cache(fixture / "tiny_smolvlm", "someone/tiny-smolvlm", "model", str(cache))
    monkeypatch.chdir(tmp_path)
    resolved = Path(resolve_pretrained("someone/tiny-smolvlm", "--policy.vlm_model_name"))
    assert (resolved / "tokenizer.json").read_bytes() == (
        fixture / "tiny_smolvlm" / "tokenizer.json"
    ).read_bytes()
    with pytest.raises(ConfigError, match=r"^--policy.vlm_model_name=someone/absent: not a local directory"):
        resolve_pretrained("someone/absent", "--policy.vlm_model_name")


def test_load_vlm_weights_copies_the_backbones_weights_into_the_vlm(fixture: Path, tmp_path: Path) -> None:
    """--policy.load_vlm_weights=true: the backbone directory's model.safetensors goes into the VLM at
    the start of training (its text layers beyond num_vlm_layers are not kept); the expert keeps its
    own initialization."""
    from safetensors.torch import save_file
    from transformers import AutoConfig, SmolVLMForConditionalGeneration

    from trainer.policies.common.base import build_policy

    backbone = tmp_path / "pretrained_smolvlm"
    shutil.copytree(fixture / "tiny_smolvlm", backbone)
    torch.manual_seed(7)
    vlm = SmolVLMForConditionalGeneration(AutoConfig.from_pretrained(str(backbone)))
    save_file({k: v.contiguous() for k, v in vlm.state_dict().items()}, str(backbone / "model.safetensors"))
    config = SmolVLAConfig(vlm_model_name=str(backbone), load_vlm_weights=True, num_vlm_layers=4,
                           input_features=["observation.state", "observation.images.top", "task"])  # fmt: skip
    torch.manual_seed(0)
    policy = build_policy(config, 4, 2)
    expert = policy.model.vlm_with_expert.lm_expert.layers[0].mlp.up_proj.weight.clone()
    policy.load_pretrained_parts()
    ours = policy.model.vlm_with_expert.vlm.state_dict()
    assert set(ours) <= set(vlm.state_dict())
    assert all(torch.equal(ours[k], vlm.state_dict()[k]) for k in ours)
    assert torch.equal(policy.model.vlm_with_expert.lm_expert.layers[0].mlp.up_proj.weight, expert)


def test_task_bytes_of_batches_with_different_lengths_concatenate() -> None:
    """A mixture's batch gathers its members' task bytes (of different widths) into one tensor."""
    from trainer.data.dataset import cat_task_bytes, task_bytes, task_texts

    parts = [task_bytes(["push the green block"]), task_bytes(["reach", "reach the corner the colour names"])]
    assert task_texts(cat_task_bytes(parts)) == [
        "push the green block",
        "reach",
        "reach the corner the colour names",
    ]
