"""Real multi-process training runs (gloo): DDP 2, FSDP2 2 (bf16) and 4, HSDP 2x2.

Each configuration is launched once per session through the real CLI; the tests read what it left:
exit code, banner, checkpoints (through ckpt_tools), metrics.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import ckpt_tools
from helpers.launch import run_torchrun
from helpers.run_outputs import metrics, saved_model
from helpers.train_flags import tiny_args
from trainer.data.embedded import sim
from trainer.evaluation.rollouts import EVAL_SEED_BASE

pytestmark = pytest.mark.distributed

SCRIPT = Path(__file__).parent / "scripts" / "train_cli.py"

RUNS: dict[str, tuple[int, list[str]]] = {
    "ddp2": (2, ["--trackio.enable=true", "--trackio.project=ddp2-main-rank-only"]),
    "fsdp2_bf16": (
        2,
        [
            "--parallelism.dp_shard=2",
            "--accelerator.mixed_precision=bf16",
            "--checkpoint_format=dcp",
            "--dataset.eval_episodes=2",
        ],
    ),
    "fsdp4": (4, ["--parallelism.dp_shard=-1", "--checkpoint_format=safetensors_dcp"]),
    "hsdp2x2": (4, ["--parallelism.dp_replicate=2", "--parallelism.dp_shard=2", "--checkpoint_format=dcp"]),
}
EXPECTED = {
    "ddp2": ((2, 1), "DDP 2"),
    "fsdp2_bf16": ((1, 2), "FSDP2 2"),
    "fsdp4": ((1, 4), "FSDP2 4"),
    "hsdp2x2": ((2, 2), "HSDP 2x2"),
}


@pytest.fixture(scope="session")
def train_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    """Launch every configuration once: name -> (output_dir, combined output)."""
    root = tmp_path_factory.mktemp("train_runs")
    cache = root / "dataset_cache"
    results = {}
    for name, (nproc, flags) in RUNS.items():
        out = root / name
        args = tiny_args(str(out), str(cache), *flags)
        results[name] = (out, run_torchrun(SCRIPT, nproc, *args, timeout=240).stdout)
    return results


@pytest.mark.parametrize("name", list(RUNS))
def test_run_trains_and_checkpoints(train_runs, name: str) -> None:
    out, log = train_runs[name]
    (replicate, shard), describe = EXPECTED[name]
    assert f"{describe} (" in log
    assert (
        f"effective batch size {8 * replicate * shard} = batch_size 8 x dp_world_size {replicate * shard}"
        in log
    )
    last = ckpt_tools.latest_step_dir(str(out))
    assert last is not None and last.endswith("000004")
    step = ckpt_tools.read_training_step(last)
    assert (step.topology.dp_replicate, step.topology.dp_shard) == (replicate, shard)
    assert (step.sampler.epoch, step.sampler.offset) == (0, 4 * 8 * replicate * shard)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["000002", "000004", "last"]
    records = metrics(out)
    assert [r["step"] for r in records if r.get("event") == "train"] == [2, 4]  # main rank only


def test_trackers_log_from_the_main_rank_only(train_runs) -> None:
    """DDP 2 with trackio: one run in the local store, each logged step once (rank 1 logs nothing)."""
    from trackio.sqlite_storage import SQLiteStorage

    from helpers.tracker_stores import trackio_logs

    (run,) = SQLiteStorage.get_runs("ddp2-main-rank-only")
    assert [row["step"] for row in trackio_logs("ddp2-main-rank-only", run) if "loss" in row] == [2, 4]


@pytest.mark.parametrize(
    ("name", "placements"),
    [
        ("fsdp2_bf16", "(Shard(dim=0),) on mesh ('dp_shard_cp',)"),
        ("fsdp4", "(Shard(dim=0),) on mesh ('dp_shard_cp',)"),
        ("hsdp2x2", "(Replicate(), Shard(dim=0)) on mesh ('dp_replicate', 'dp_shard_cp')"),
    ],
)
def test_sharded_runs_shard_for_real(train_runs, name: str, placements: str) -> None:
    out, log = train_runs[name]
    assert f"parameters: DTensor placements {placements}" in log
    assert "Slicing a flattened dim" not in log  # torch's deprecation noise about accelerate's mesh
    state_dir = out / "checkpoints" / "000004" / "training_state"
    assert (state_dir / "optimizer_0" / ".metadata").is_file()  # sharded: the optimizer is always DCP
    assert not (state_dir / "optimizer_state.safetensors").exists()


def test_ddp_writes_plain_safetensors(train_runs) -> None:
    out, log = train_runs["ddp2"]
    assert "parameters: plain tensors (DistributedDataParallel)" in log
    step_dir = out / "checkpoints" / "000004"
    assert (step_dir / "pretrained_model" / "model.safetensors").is_file()
    assert (step_dir / "training_state" / "optimizer_state.safetensors").is_file()


def test_checkpoint_formats(train_runs) -> None:
    model = {name: saved_model(train_runs[name][0], 4) for name in RUNS}
    assert (model["fsdp2_bf16"] / "pytorch_model_fsdp_0" / ".metadata").is_file()
    assert not (model["fsdp2_bf16"] / "model.safetensors").exists()
    assert (model["fsdp4"] / "pytorch_model_fsdp_0" / ".metadata").is_file()
    assert (model["fsdp4"] / "model.safetensors").is_file()


def test_sharded_select_action_evaluates_on_every_rank(train_runs) -> None:
    out, log = train_runs["fsdp2_bf16"]
    assert "evaluation over 2 episodes: policy return" in log and "(2 processes, FSDP, device cpu" in log
    summary = metrics(out)[-1]
    assert summary["event"] == "summary" and math.isfinite(summary["policy_return"])
    # 2 episodes over 2 ranks: rank r rolls out seed EVAL_SEED_BASE + r; the reduced mean holds both
    seeds = (EVAL_SEED_BASE, EVAL_SEED_BASE + 1)
    expected = sum(sim.rollout(sim.random_controller(seed), seed)[2] for seed in seeds) / 2
    assert summary["random_return"] == pytest.approx(expected, rel=1e-9)
