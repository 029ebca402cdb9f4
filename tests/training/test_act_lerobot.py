"""LeRobot's ACT checkpoint (lerobot-train 0.6.1, state + environment state, no camera) read by our
ACT: its config.json schema, its tensors under our names (fused attention projections split), its
processors; `--policy.path` fine-tunes from it; and LeRobot's ACT trains on a channel-first dataset."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

import trainer
from helpers.fixtures import copy_fixture, fixture_dir
from helpers.train_flags import TINY_LEROBOT_ACT
from trainer.cli.parse import parse_config
from trainer.engine.plan import train
from trainer.errors import ConfigError
from trainer.policies import act
from trainer.policies.act import lerobot as act_lerobot
from trainer.policies.common import pretrained

FIXTURE = Path(__file__).parents[1] / "fixtures" / "lerobot" / "checkpoint_act" / "checkpoints" / "000002"
MODEL = FIXTURE / "pretrained_model"


@pytest.fixture(scope="module")
def loaded() -> trainer.LoadedPolicy:
    return trainer.load_policy(str(MODEL))


def _batch(policy: act.ACTPolicy) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {"observation.state": torch.randn(3, policy.config.obs_dim, generator=generator)}


def test_the_config_is_read_from_lerobots_schema(loaded) -> None:
    config = loaded.policy.config
    assert config.input_features == ["observation.state", "observation.environment_state"]
    assert (config.obs_dim, config.env_state_dim, config.action_dim) == (7, 3, 2)
    assert (config.dim_model, config.n_heads, config.chunk_size, config.latent_dim) == (32, 2, 5, 8)


@pytest.mark.numerics
def test_every_lerobot_tensor_arrives_once(loaded) -> None:
    """Names one-to-one (the fused projections three to one), every value arrives once."""
    theirs = load_file(str(MODEL / "model.safetensors"))
    ours = loaded.policy.state_dict()
    assert set(act_lerobot.state_from_lerobot(theirs)) == set(ours)
    fused = sum(1 for name in theirs if "in_proj_" in name)
    assert len(ours) == len(theirs) - 1 + 2 * fused  # the dropped vae_encoder_pos_enc, 3 for 1

    # every value once: the sorted values of both sides, bit for bit. (Sums compared for equality were
    # exact only by luck: these weights span 37 binary orders, 1.6e-11 to 2.9, more than a float64 sum
    # of 31,698 float32 values holds exactly, so grouping the split tensors otherwise than the fused
    # ones, or another CPU's summation order, could move the last bit.)
    def values(state: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.cat([t.flatten() for t in state.values()]).sort().values

    kept = values({n: t for n, t in theirs.items() if n != "model.vae_encoder_pos_enc"})
    assert torch.equal(values(ours), kept)


@pytest.mark.numerics
def test_the_recomputed_position_encoding_is_lerobots(loaded) -> None:
    theirs = load_file(str(MODEL / "model.safetensors"))["model.vae_encoder_pos_enc"]
    # bit for bit: computed in float64 as LeRobot does with numpy, then rounded to float32, which
    # absorbs the last-bit differences of one libm or SIMD sin/cos against another (2**-29 of a float32 ulp)
    assert torch.equal(loaded.policy.vae_encoder_pos_enc, theirs)


@pytest.mark.numerics
def test_split_projections_compute_lerobots_fused_attention(loaded) -> None:
    """Our q/k/v attention on the split weights equals torch's MultiheadAttention (LeRobot's layer)
    on the fused ones: the split's order and the heads' layout are right."""
    theirs = load_file(str(MODEL / "model.safetensors"))
    prefix = "model.decoder.layers.0.multihead_attn."
    reference = torch.nn.MultiheadAttention(32, 2, batch_first=True)
    reference.load_state_dict({k.removeprefix(prefix): v for k, v in theirs.items() if k.startswith(prefix)})
    generator = torch.Generator().manual_seed(1)
    q, kv = torch.randn(2, 5, 32, generator=generator), torch.randn(2, 4, 32, generator=generator)
    ours = loaded.policy.decoder.layers[0].multihead_attn(q, kv, kv)
    # the same products summed in another order (split projections against the fused in_proj, another
    # attention kernel): each within (32 + 4) * U * sum(|terms|) of the exact result, outputs O(1), so
    # ~1e-7 apart; atol 1e-6 leaves margin, and a wrong split order or head layout moves them by ~1e-1
    torch.testing.assert_close(ours, reference(q, kv, kv, need_weights=False)[0], rtol=0, atol=1e-6)


def test_loaded_actions_equal_our_act_on_the_renamed_weights(loaded) -> None:
    renamed = act_lerobot.state_from_lerobot(load_file(str(MODEL / "model.safetensors")))
    fresh = act.ACTPolicy(loaded.policy.config)
    fresh.load_state_dict(renamed, strict=True)
    fresh.eval()
    batch = _batch(fresh)
    chunk = loaded.policy.predict_chunk(batch)
    assert chunk.shape == (3, 5, 2)
    assert torch.equal(chunk, fresh.predict_chunk(batch))
    environment = dict(batch, **{"observation.state": batch["observation.state"].clone()})
    environment["observation.state"][:, 4:] += 1  # the environment token is read
    assert not torch.equal(chunk, fresh.predict_chunk(environment))


def test_the_environment_state_is_left_unnormalized_as_lerobot_does(loaded) -> None:
    stats = loaded.preprocessor.steps[0].stats["observation.state"]
    assert torch.equal(stats["mean"][4:], torch.zeros(3)) and torch.equal(stats["std"][4:], torch.ones(3))
    assert not torch.equal(stats["std"][:4], torch.ones(4))


def test_a_tensor_of_another_shape_is_one_line_naming_it(loaded) -> None:
    config = loaded.policy.config
    wider = act.ACTPolicy(type(config)(**{**vars(config), "dim_feedforward": 48}))
    state = load_file(str(MODEL / "model.safetensors"))
    with pytest.raises(ConfigError, match=r"its tensor \S+\.ffn\.linear1\.\w+ is \[64.*has \[48"):
        pretrained.fit_weights(wider, state, "base")


def test_lerobots_checkpoint_fine_tunes_here(tmp_path: Path, monkeypatch) -> None:
    """--policy.path=<LeRobot's checkpoint step>: its config, weights and statistics, trained on."""
    from accelerate.state import AcceleratorState

    copy_fixture(tmp_path, "lerobot", "dataset_tiny")
    monkeypatch.chdir(tmp_path)
    AcceleratorState._reset_state(reset_partial_state=True)
    flags = [f"--policy.path={FIXTURE}", "--dataset.root=dataset_tiny", "--batch_size=2"]
    train(parse_config([*flags, "--num_workers=0", "--steps=1", "--output_dir=tuned"]))
    AcceleratorState._reset_state(reset_partial_state=True)
    tuned = trainer.load_policy(str(tmp_path / "tuned" / "checkpoints" / "last"))
    base = act_lerobot.state_from_lerobot(load_file(str(MODEL / "model.safetensors")))
    after = tuned.policy.state_dict()
    assert set(after) == set(base)
    assert not torch.equal(after["action_head.weight"], base["action_head.weight"])


def test_lerobots_act_trains_on_a_channel_first_dataset(tmp_path: Path, clean_accelerate) -> None:
    """dataset_channel_first (cameras declared (C, H, W), one image and one video): a tiny ACT trains
    2 steps, its cameras recorded at the shapes LeRobot's `dataset_to_policy_features` gives them."""
    from accelerate.state import AcceleratorState

    root = copy_fixture(tmp_path, "lerobot", "dataset_channel_first")
    flags = [f"--dataset.root={root}", "--policy.type=act", *TINY_LEROBOT_ACT, "--batch_size=4"]
    flags += [
        "--num_workers=0",
        "--steps=2",
        "--save_freq=2",
        "--log_freq=1",
        f"--output_dir={tmp_path / 'run'}",
    ]
    summary = train(parse_config(flags))
    AcceleratorState._reset_state(reset_partial_state=True)
    assert summary.steps == 2 and math.isfinite(summary.final_loss)
    with safe_open(fixture_dir("lerobot", "dataset_channel_first_frames.safetensors"), "pt") as frames:
        features = json.loads(frames.metadata()["dataset_to_policy_features"])
    trained = trainer.load_policy(str(tmp_path / "run" / "checkpoints" / "last"))
    visual = {name: f["shape"] for name, f in features.items() if f["type"] == "VISUAL"}
    assert trained.policy.config.image_shapes == visual and len(visual) == 2
    config = trained.policy.config
    saved = config.lerobot_adapter().config_to_lerobot(config)["input_features"]
    assert {name: saved[name]["shape"] for name in visual} == visual
