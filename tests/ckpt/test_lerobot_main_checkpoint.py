"""Checkpoints of LeRobot main's parallel engine (FSDP2 x2, `--checkpoint_format=dcp` and
`safetensors_dcp`, tests/fixtures/lerobot_main_dcp) are LeRobot's: their `training_step.json` holds
`dp_world_size`, `grad_accum_steps` and `parallelism` (no `num_processes`, no `format_version`), and
every `ckpt` command reads them as LeRobot's layout, with their DCP directories as model and optimizer;
`verify --deep` reads every byte of their records."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from report_fixtures import run_ckpt
from safetensors.torch import load_file

import ckpt_tools
import ckpt_tools.training
from ckpt_tools import layout
from ckpt_tools.catalog import LEROBOT, catalog
from ckpt_tools.dcp.index import read_dcp_index
from ckpt_tools.dcp.records import locate_chunk_data
from ckpt_tools.format.meta import LeRobotStep, is_lerobot_step
from helpers.fixtures import copy_fixture

LINE = "LeRobot layout (step 2, dp_world_size 2, parallelism FSDP2 2, batch_size 2)"
STEP = Path("checkpoints") / "000002"


@pytest.fixture(scope="module")
def fixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_fixture(tmp_path_factory.mktemp("main"), "lerobot_main_dcp")


@pytest.fixture(params=["a_fsdp2x2_dcp", "b_fsdp2x2_safetensors_dcp"])
def step(fixture: Path, request: pytest.FixtureRequest) -> Path:
    """Step 2 of each format: dcp (model DCP only) and safetensors_dcp (both)."""
    return fixture / request.param / STEP


def test_mains_training_step_is_lerobots(fixture: Path) -> None:
    data = json.loads(
        (fixture / "a_fsdp2x2_dcp" / STEP / "training_state" / "training_step.json").read_text()
    )
    assert is_lerobot_step(data)
    read = LeRobotStep.from_dict(data)
    assert (read.step, read.dp_world_size, read.batch_size, read.grad_accum_steps) == (2, 2, 2, 1)
    assert read.parallelism is not None and read.parallelism.describe() == "FSDP2 2"
    assert read.sampler.offset == 8  # LeRobot resumes its data at sample 8 (its log says so)
    assert is_lerobot_step({"step": 4, "num_processes": 1, "batch_size": 2})  # 0.6.x
    hsdp = {**data, "dp_world_size": 4, "parallelism": {**data["parallelism"], "dp_replicate": 2}}
    assert LeRobotStep.from_dict(hsdp).describe() == (
        "step 2, dp_world_size 4, parallelism HSDP 2x2, batch_size 2"
    )
    for ours in ("topology", "sampler", "mixed_precision", "checkpoint_format"):
        assert not is_lerobot_step({**data, ours: None})  # our own pre-v1 files: an older release


def test_inspect_shows_the_layout_and_both_dcp_directories(step: Path) -> None:
    assert catalog(step).layout == LEROBOT
    described = json.loads(run_ckpt("inspect", step, "--json").stdout)
    assert described["layout"] == LEROBOT and described["training_step"] is None
    assert described["lerobot"] == {
        "step": 2,
        "dp_world_size": 2,
        "batch_size": 2,
        "grad_accum_steps": 1,
        "parallelism": {"dp_replicate": 1, "dp_shard": 2, "cp_size": 1, "tp_size": 1},
    }
    assert {"dcp", "optimizer dcp"} <= set(described["formats"])
    human = run_ckpt("inspect", step)
    assert human.exit_code == 0, human.stderr
    assert LINE in human.stdout and "older release" not in human.stdout + human.stderr
    assert "pytorch_model_fsdp_0: 62 tensors" in human.stdout
    assert "optimizer_0: 183 tensors" in human.stdout  # 61 parameters x (exp_avg, exp_avg_sq, step)


@pytest.mark.parametrize("deep", [False, True])
def test_verify_passes_and_checks_the_dcp_directories(step: Path, deep: bool) -> None:
    report = ckpt_tools.verify_checkpoint(step, deep=deep)
    assert report.ok, report.problems
    assert "pretrained_model/pytorch_model_fsdp_0: model keys" in report.checked
    assert "training_state/optimizer_0: optimizer keys" in report.checked
    assert "optimizer state names the model's tensors" in report.checked
    assert ("training_state/optimizer_0: chunk records (CRC-32)" in report.checked) == deep
    result = run_ckpt("verify", *(["--deep"] if deep else []), step)
    assert result.exit_code == 0 and LINE in result.stdout and "OK" in result.stdout


def test_deep_verify_finds_a_flipped_byte_of_a_moment(fixture: Path, tmp_path: Path) -> None:
    step = Path(shutil.copytree(fixture / "a_fsdp2x2_dcp" / STEP, tmp_path / "000002"))
    shards = step / "training_state" / "optimizer_0"
    entry = read_dcp_index(shards).tensors["optimizer.state.model.action_head.weight.exp_avg"]
    chunk = entry.chunks[0]
    with (shards / chunk.file).open("rb") as handle:
        data = locate_chunk_data(handle, chunk, entry.dtype, "test")
    assert data is not None
    damaged = bytearray((shards / chunk.file).read_bytes())
    damaged[data.offset + 5] ^= 0x10
    (shards / chunk.file).write_bytes(bytes(damaged))
    assert ckpt_tools.verify_checkpoint(step).ok  # metadata alone cannot see it
    (problem,) = ckpt_tools.verify_checkpoint(step, deep=True).problems
    assert chunk.file in problem and "CRC-32" in problem


def test_verify_names_optimizer_state_of_no_model_tensor(fixture: Path, tmp_path: Path) -> None:
    """The optimizer's FQN keys are checked against the model's: here the model DCP of another run
    whose tensor names lack LeRobot's `model.` prefix stands beside LeRobot's optimizer."""
    step = Path(shutil.copytree(fixture / "a_fsdp2x2_dcp" / STEP, tmp_path / "000002"))
    model_dir = step / "pretrained_model" / "pytorch_model_fsdp_0"
    shutil.rmtree(model_dir)
    merged = load_file(fixture / "lerobot_convert_dcp" / "a_000002_model.safetensors")
    import torch.distributed.checkpoint as dcp

    dcp.save({k.removeprefix("model."): v for k, v in merged.items()}, checkpoint_id=str(model_dir))
    problems = ckpt_tools.verify_checkpoint(step).problems
    assert any("which the model does not hold" in p and "action_head.weight" in p for p in problems), problems


def test_convert_is_lerobots_own_merge_bit_for_bit(step: Path, fixture: Path, tmp_path: Path) -> None:
    result = run_ckpt("convert", step, "--to", "safetensors", "--output", tmp_path / "out")
    assert result.exit_code == 0, result.stderr
    assert f"read {LINE}" in result.stdout
    got = load_file(tmp_path / "out" / layout.MODEL_SAFETENSORS)
    want = load_file(fixture / "lerobot_convert_dcp" / "a_000002_model.safetensors")
    assert sorted(got) == sorted(want) and len(want) == 62
    assert all(torch.equal(got[name], want[name]) for name in want)


def test_diff_compares_the_two_formats(fixture: Path) -> None:
    a, b = fixture / "a_fsdp2x2_dcp" / STEP, fixture / "b_fsdp2x2_safetensors_dcp" / STEP
    result = run_ckpt("diff", a, b)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.count(LINE) == 2 and "IDENTICAL: 62 of 62" in result.stdout


def test_a_lerobot_step_plans_a_resume_like_ours(fixture: Path) -> None:
    """`training_step.json` with `train_config.json` as the `TrainingStep` a resume plans from."""
    step = fixture / "a_fsdp2x2_dcp" / STEP
    assert ckpt_tools.training.is_lerobot_checkpoint(step)
    saved = ckpt_tools.training.read_lerobot_training_step(step)
    assert (saved.step, saved.dp_world_size, saved.batch_size, saved.grad_accum_steps) == (2, 2, 2, 1)
    assert (saved.topology.describe(), saved.checkpoint_format, saved.seed) == ("FSDP2 2", "dcp", 1)
    assert (saved.sampler.epoch, saved.sampler.offset, saved.mixed_precision) == (0, 8, "no")
    shape = ckpt_tools.training.RunShape(
        topology=ckpt_tools.training.Topology(), batch_size=4, grad_accum_steps=1, mixed_precision="no"
    )
    plan = ckpt_tools.training.plan_resume(saved, shape)
    assert plan.step == 2 and plan.sample_exact and plan.changes[0] == "topology FSDP2 2 -> single process"
