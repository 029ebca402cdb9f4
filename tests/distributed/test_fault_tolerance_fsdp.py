"""Fault tolerance of replica groups sharded with FSDP2 (docs/fault_tolerance.md), with real processes:
each group a `torchrun --nproc-per-node=2` of `trainer train --parallelism.dp_shard=2`, meeting on a
`trainer lighthouse`, with the EMA and windows of two accumulated micro-batches. A group that joins
late heals from its live peer rank by rank at a window's start: every rank takes the same rank's
shards over (the model, the EMA, the optimizer's sharded moments as DTensors on its own mesh, the step
counters) and the two groups then train as one. And gradient accumulation under
fault tolerance: a quorum per window, the groups' average once per window, equal to plain DDP.

Every wait is for a state (a line printed, a process exited), bounded; every process started here is
stopped by the fixture that started it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from helpers.fault_tolerance import (
    TINY,
    final_weights,
    finish,
    finished_digests,
    group_flags,
    lighthouse,
    logged_step,
    quorum_records,
    start_group,
    train_losses,
)
from helpers.launch import launch_env, run_torchrun, torchrun_command
from helpers.waiting import wait_for

pytestmark = pytest.mark.distributed

SCRIPT = Path(__file__).parent / "scripts" / "train_cli.py"
HEAL_STEPS = 200
SHARDED = ("--parallelism.dp_shard=2", "--ema.enable=true", "--accelerator.gradient_accumulation.steps=2")


def start_sharded_group(log: Path, *args: str) -> subprocess.Popen[str]:
    """One replica group of two FSDP2 ranks: a torchrun of its own (a launcher store of its own on a
    free port), output to `log`."""
    with log.open("w") as out:
        return subprocess.Popen(
            torchrun_command(SCRIPT, 2, *SHARDED, *args),
            env={**launch_env(), "RUST_LOG": "warn"},
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )


def workers(launcher: subprocess.Popen[str]) -> list[int]:
    """The pids of a torchrun's worker processes (its children)."""
    children = Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children").read_text()
    return [int(pid) for pid in children.split()]


@contextlib.contextmanager
def paused(launcher: subprocess.Popen[str]) -> Iterator[None]:
    """Every worker of a torchrun stopped (SIGSTOP) for the block, continued after it."""
    pids = workers(launcher)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


def heard_by(address: str, replica_id: int) -> bool:
    """Whether the Lighthouse's status page lists a heartbeat of the replica group `replica_id` (its
    Manager is up: the group is about to ask for its first quorum)."""
    with urllib.request.urlopen(f"{address}/status", timeout=30) as page:
        return f"replica_{replica_id:06d}" in page.read().decode()


@pytest.fixture(scope="module")
def sharded_late_joiner(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """Group 0 (FSDP2 over two ranks) trains alone; once it logged step 20 its workers are paused and
    group 1 (the same launch) starts into the same output_dir, with no checkpoint there to resume
    (its optimizer holds no state yet). Group 0 goes on once the Lighthouse hears group 1's Manager,
    so that group 1's first quorum finds it alive and heals from it. The long heartbeat and join
    timeouts keep the paused group 0 in the quorum. Returns the output_dir and both groups' logs."""
    root = tmp_path_factory.mktemp("ft_fsdp_heal")
    out = root / "run"
    args = (
        *TINY,
        f"--dataset.cache_dir={root / 'cache'}",
        f"--steps={HEAL_STEPS}",
        "--log_freq=10",
        f"--save_freq={HEAL_STEPS}",
        "--resume=true",
        f"--output_dir={out}",
    )
    logs = [root / "group0.log", root / "group1.log"]
    with lighthouse(1, "--heartbeat_timeout_ms=120000", "--join_timeout_ms=120000") as (_, address):
        groups = [start_sharded_group(logs[0], *args, *group_flags(address, 0))]
        try:
            wait_for(lambda: logged_step(out / "replica_0") >= 20, "group 0 at step 20", 240, groups)
            with paused(groups[0]):
                groups.append(start_sharded_group(logs[1], *args, *group_flags(address, 1)))
                wait_for(lambda: heard_by(address, 1), "group 1's Manager", 240, groups[1:])
        finally:
            codes = finish(groups, timeout=300)
    texts = [log.read_text() for log in logs]
    assert codes == [0, 0], "\n".join(texts)
    return out, texts


def test_a_sharded_group_heals_rank_by_rank_from_its_peer_and_both_end_equal(sharded_late_joiner) -> None:
    """Group 1 joins at a step group 0 has reached: as that step starts, both ranks of group 1 hold
    what the same rank of group 0 holds, bit for bit: the weights (the model and the EMA) and the
    optimizer's state (its sharded moments and step counters), though group 1 had taken no step of
    its own; both groups then finish at --steps with equal weights on every rank."""
    out, logs = sharded_late_joiner
    peer = quorum_records(out / "replica_0")
    assert [(q["replicas"], q["replica_rank"]) for q in peer] == [(1, 0), (2, 0)], peer
    joined = peer[-1]
    assert 20 < joined["step"] < HEAL_STEPS and joined["step"] % 2 == 1, f"group 1 joined at {joined['step']}"
    assert f"healed from a live replica group: continuing after its step {joined['step'] - 1}" in logs[1]
    healed = quorum_records(out / "replica_1")
    assert [(q["step"], q["replicas"], q["replica_rank"]) for q in healed] == [(joined["step"], 2, 1)]
    assert healed[0]["weights_sha256"] == joined["weights_sha256"]
    assert healed[0]["optimizer_sha256"] == joined["optimizer_sha256"]
    digests = finished_digests(out, 2)
    assert digests[0] == digests[1] and [step for step, _ in digests[0]] == [HEAL_STEPS]


def test_two_groups_accumulating_train_as_plain_ddp_accumulating_does(tmp_path: Path) -> None:
    """Two replica groups of one process with --accelerator.gradient_accumulation.steps=2 train to
    2-rank DDP's weights and losses with the same accumulation: each group sums its window's two
    micro-batches, the groups average the sum once per window and commit it, and each reads its replica
    id's share of every loop step's global batch. A quorum opens each window (steps 1 and 3), not
    each micro-batch: both groups' records show one membership, at step 1, and the same digests."""
    cache, accumulate = (
        f"--dataset.cache_dir={tmp_path / 'cache'}",
        "--accelerator.gradient_accumulation.steps=2",
    )
    run_torchrun(SCRIPT, 2, *TINY, cache, accumulate, f"--output_dir={tmp_path / 'ddp'}", timeout=240)
    logs = [tmp_path / f"group{r}.log" for r in (0, 1)]
    with lighthouse(2) as (_, address):
        args = (*TINY, cache, accumulate, f"--output_dir={tmp_path / 'ft'}")
        groups = [start_group(logs[r], *args, *group_flags(address, r)) for r in (0, 1)]
        codes = finish(groups, timeout=240)
    assert codes == [0, 0], "\n".join(log.read_text() for log in logs)
    torch.testing.assert_close(final_weights(tmp_path / "ft"), final_weights(tmp_path / "ddp"))
    per_group = [train_losses(tmp_path / "ft" / f"replica_{r}") for r in (0, 1)]
    mean = [(a + b) / 2 for a, b in zip(*per_group, strict=True)]
    assert len(mean) == 4 and mean == pytest.approx(train_losses(tmp_path / "ddp"))
    records = [quorum_records(tmp_path / "ft" / f"replica_{r}") for r in (0, 1)]
    assert [[(q["step"], q["replicas"]) for q in group] for group in records] == [[(1, 2)], [(1, 2)]]
    assert finished_digests(tmp_path / "ft", 2)[0] == finished_digests(tmp_path / "ft", 2)[1]
