"""The way back: `trainer export --lerobot_step=true` writes a step of ours (ACT, FSDP2 x2) as LeRobot
main's step, and our own LeRobot-main reader (`--resume=true --config_path=<export>/pretrained_model/
train_config.json`, the path a LeRobot run's step takes here) restores from it our weights, AdamW
moments and step counts, our step and data offset and rank 0's generators, bit for bit; `ckpt verify`
calls it LeRobot's layout. That LeRobot main itself continues it is checked beside LeRobot
(benchmarks/lerobot_main_resume.py, `nox -s lerobot_side`), never here. One training launch and one
resume serve every assertion."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import ckpt_tools
import ckpt_tools.training
from ckpt_tools.catalog import catalog
from ckpt_tools.tensors.tensor_io import read_dcp_full
from helpers.fixtures import copy_fixture
from helpers.launch import run_torchrun
from trainer import load_policy
from trainer.cli import export_command
from trainer.errors import ConfigError

pytestmark = pytest.mark.distributed

SCRIPTS = Path(__file__).parent / "scripts"
ACT = [  # LeRobot's flags of tests/fixtures/lerobot_main_dcp (its README), our ACT at that size
    "--dataset.repo_id=local/tiny", "--policy.type=act", "--policy.device=cpu", "--policy.dim_model=32",
    "--policy.n_heads=2", "--policy.dim_feedforward=64", "--policy.n_encoder_layers=1",
    "--policy.n_decoder_layers=1", "--policy.n_vae_encoder_layers=1", "--policy.latent_dim=8",
    "--policy.chunk_size=5", "--policy.n_action_steps=5", "--policy.env_state_dim=3", "--steps=2",
    "--save_freq=2", "--batch_size=2", "--num_workers=0", "--log_freq=1", "--seed=1",
    "--parallelism.dp_shard=2", "--checkpoint_format=dcp",
]  # fmt: skip


@pytest.fixture(scope="module")
def round_trip(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict, str]:
    """(our step, its export, what the resume from the export restored, the export's line)."""
    work = tmp_path_factory.mktemp("way_back")
    dataset = copy_fixture(work, "lerobot_main_dcp") / "dataset"
    train = [*ACT, f"--dataset.root={dataset}", f"--output_dir={work / 'ours'}"]
    run_torchrun(SCRIPTS / "train_cli.py", 2, *train, timeout=300)
    ours, exported = work / "ours" / "checkpoints" / "000002", work / "exported" / "checkpoints" / "000002"
    line = export_command.run([f"--policy.path={ours}", f"--output_dir={exported}", "--lerobot_step=true"])
    observed = work / "observed.pt"
    config = exported / "pretrained_model" / "train_config.json"
    resume = [f"--config_path={config}", "--resume=true", f"--output_dir={work / 'resumed'}", "--steps=3"]
    run_torchrun(
        SCRIPTS / "lerobot_resume.py", 1, str(observed), str(work), *resume, "--parallelism.dp_shard=1"
    )
    return ours, exported, torch.load(observed, weights_only=False), line


def test_the_export_is_lerobot_mains_layout(round_trip) -> None:
    _, exported, _, line = round_trip
    assert line.startswith(f"wrote {exported} as a LeRobot main step")
    report = ckpt_tools.verify_checkpoint(exported)
    assert report.ok, report.problems
    layout_line = catalog(exported).layout_line()
    assert layout_line == "LeRobot layout (step 2, dp_world_size 2, parallelism FSDP2 2, batch_size 2)"
    step = json.loads((exported / "training_state" / "training_step.json").read_text())
    parallelism = {"dp_replicate": 1, "dp_shard": 2, "ring_degree": 1, "ulysses_degree": 1}
    assert step == {
        "step": 2,
        "dp_world_size": 2,
        "batch_size": 2,
        "grad_accum_steps": 1,
        "parallelism": parallelism,
    }
    config = json.loads((exported / "pretrained_model" / "train_config.json").read_text())
    assert config["checkpoint_format"] == "safetensors_dcp" and config["scheduler"] is None
    assert config["policy"]["input_features"]["observation.environment_state"] == {
        "type": "ENV",
        "shape": [3],
    }


def test_weights_come_back_bit_for_bit(round_trip) -> None:
    ours, exported, observed, _ = round_trip
    want = load_policy(str(ours), "cpu", "model").policy.state_dict()
    got = observed["model"]
    assert sorted(got) == sorted(want)
    assert all(torch.equal(got[name], want[name]) for name in want)
    # LeRobot main's resume reads the DCP shards (`model.<fqn>`), ours the full file beside them: the same
    shards = read_dcp_full(str(exported / "pretrained_model" / "pytorch_model_fsdp_0"))
    merged = load_file(exported / "pretrained_model" / "model.safetensors")
    assert sorted(shards) == sorted(f"model.{name}" for name in merged)
    assert all(torch.equal(shards[f"model.{name}"], tensor) for name, tensor in merged.items())


def test_adamw_moments_and_steps_come_back_bit_for_bit(round_trip) -> None:
    ours, _, observed, _ = round_trip
    want = ckpt_tools.training.read_named_optimizer_state(str(ours))["state"]
    got = observed["optimizer"]["state"]
    assert sorted(got) == sorted(want)
    for fqn, entry in want.items():
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(got[fqn][key], entry[key]), (fqn, key)
    assert {float(entry["step"]) for entry in got.values()} == {2.0}


def test_step_offset_and_rng_come_back(round_trip) -> None:
    ours, _, observed, _ = round_trip
    assert observed["start_step"] == 2 and observed["offset"] == 8  # 2 steps x batch 2 x 2 ranks
    saved = load_file(ours / "training_state" / "rng_state.safetensors")
    (python, numpy_state, torch_state) = observed["rng"][0]
    assert torch.equal(torch_state, saved["rank0/torch"])
    assert python[1] == tuple(saved["rank0/python"].tolist())
    assert (numpy_state[1] == saved["rank0/numpy"].numpy()).all()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--lerobot_step=yes"], "--lerobot_step=yes: give true or false"),
        (["--lerobot_step=true", "--weights=ema"], "drop --weights"),
    ],
)
def test_bad_flags_are_one_line(flags: list[str], message: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=message):
        export_command.run([f"--policy.path={tmp_path}", f"--output_dir={tmp_path / 'out'}", *flags])
