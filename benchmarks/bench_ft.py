"""What per-step fault tolerance costs and what it saves (issue 56, docs/fault_tolerance.md): a tiny MLP
policy on the embedded pendulum data, gloo on CPU.

1. Steps per second of two replica groups of one process each under torchft (a Lighthouse waiting for
   both) against the same run as plain 2-rank DDP under torchrun (goal: >= 0.95x); each run's rate is
   the median of its logged windows' samples/s over the global batch, the first window (start-up) left
   out; and the time fault tolerance adds to a step (a quorum at the Lighthouse and the group's commit
   vote), which is what to weigh against a real step's seconds.
2. A failure: two groups train together, group 1 is SIGKILLed at step --kill-at and relaunched at once
   (as `torchrun --max-restarts` would, --resume=true): the steps group 0 trained while group 1 was
   down (goal: it never stops), how long it stalled before training alone (the Lighthouse's
   --heartbeat_timeout_ms), the time until group 1 was back in the quorum, and the steps lost: the
   survivor's (the one step that failed, trained again) against today's restart of the whole job from
   `last` (every step since the save before --kill-at, on every rank).

Usage: python benchmarks/bench_ft.py [--steps 800] [--kill-steps 4000] [--kill-at 100] [--save-freq 200]
       [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

TRAINER = str(Path(sys.executable).with_name("trainer"))
BATCH = 8
TINY = [
    "--policy.type=mlp",
    "--dataset.episodes=4",
    "--dataset.eval_episodes=0",
    f"--batch_size={BATCH}",
    "--log_freq=10",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--kill-steps", type=int, default=4000)
    parser.add_argument("--kill-at", type=int, default=100)
    parser.add_argument("--save-freq", type=int, default=200)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-ft-"))
    common = [*TINY, f"--dataset.cache_dir={workdir / 'cache'}"]

    plain = workdir / "ddp"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", TRAINER]
    subprocess.run(
        [*torchrun, "train", *common, f"--steps={args.steps}", f"--output_dir={plain}"], check=True
    )
    ft = workdir / "ft"
    lighthouse, address = start_lighthouse(2)
    try:
        groups = [start_group(ft, r, address, [*common, f"--steps={args.steps}"]) for r in (0, 1)]
        assert [group.wait(timeout=1800) for group in groups] == [0, 0], "a replica group failed"
    finally:
        lighthouse.kill()
    with_ft, without = steps_per_s(ft / "replica_0"), steps_per_s(plain)
    print(f"2 groups with fault tolerance: {with_ft:.1f} steps/s; plain 2-rank DDP: {without:.1f} steps/s")
    overhead_ms = 1000 * (1 / with_ft - 1 / without)  # the quorum and the commit vote, per step
    print(f"ratio: {with_ft / without:.2f}x (goal >= 0.95x); {overhead_ms:.1f} ms more per step")
    kill_and_heal(workdir / "kill", common, args.kill_steps, args.kill_at, args.save_freq)


def kill_and_heal(out: Path, common: list[str], steps: int, kill_at: int, save_freq: int) -> None:
    """Part 2: group 1 SIGKILLed at `kill_at` and relaunched at once; group 0's records say the rest."""
    flags = [*common, f"--steps={steps}", f"--save_freq={save_freq}", "--resume=true"]
    lighthouse, address = start_lighthouse(1, "--heartbeat_timeout_ms=2000", "--join_timeout_ms=1000")
    try:
        groups = [start_group(out, r, address, flags) for r in (0, 1)]
        wait_for(lambda: together(out / "replica_1") and logged_step(out / "replica_1") >= kill_at, groups)
        groups[1].send_signal(signal.SIGKILL)
        killed_at, killed_time = logged_step(out / "replica_1"), time.time()
        groups[1].wait()
        groups[1] = start_group(out, 1, address, flags, log="group1_restarted.log")
        assert [group.wait(timeout=1800) for group in groups] == [0, 0], "a replica group failed"
    finally:
        lighthouse.kill()
    changes = [r for r in records(out / "replica_0") if r.get("event") == "quorum"]
    alone, back = changes[-2:]
    assert (alone["replicas"], back["replicas"]) == (1, 2), changes
    print(f"group 1 killed after its step {killed_at}: group 0 stalled {alone['time'] - killed_time:.1f} s, ")
    print(
        f"  then trained {back['step'] - alone['step']} steps alone (steps {alone['step']}..{back['step'] - 1})"
    )
    print(
        f"  group 1 back in the quorum {back['time'] - killed_time:.1f} s after the kill, at step {back['step']}"
    )
    since_save = killed_at - killed_at // save_freq * save_freq
    print(f"steps lost: 1 (the failed step, trained again); restart from `last`: {since_save} on every rank")


def start_lighthouse(min_replicas: int, *flags: str) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [TRAINER, "lighthouse", "--bind=127.0.0.1:0", f"--min_replicas={min_replicas}", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], 120)
    line = process.stdout.readline() if ready else ""
    assert line.startswith("lighthouse: "), f"no address from trainer lighthouse: {line!r}"
    return process, line.split()[1]


def start_group(
    out: Path, replica_id: int, address: str, flags: list[str], log: str = ""
) -> subprocess.Popen[str]:
    out.mkdir(parents=True, exist_ok=True)
    ft = [
        "--fault_tolerance.enable=true",
        "--fault_tolerance.group_size=2",
        f"--fault_tolerance.replica_id={replica_id}",
        f"--fault_tolerance.lighthouse={address}",
    ]
    with (out / (log or f"group{replica_id}.log")).open("w") as handle:
        return subprocess.Popen(
            [TRAINER, "train", *flags, f"--output_dir={out}", *ft],
            env={**os.environ, "OMP_NUM_THREADS": "1", "RUST_LOG": "warn"},  # as torchrun sets it for DDP
            stdout=handle,
            stderr=subprocess.STDOUT,
            text=True,
        )


def records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def logged_step(run_dir: Path) -> int:
    steps = [r["step"] for r in records(run_dir) if r.get("event") == "train"]
    return steps[-1] if steps else 0


def together(run_dir: Path) -> bool:
    """The group's last membership change put it in a quorum of both groups."""
    changes = [r for r in records(run_dir) if r.get("event") == "quorum"]
    return bool(changes) and changes[-1]["replicas"] == 2


def steps_per_s(run_dir: Path) -> float:
    """The median of the logged windows' rates, the first window (start-up) left out."""
    rates = [r["samples_per_s"] for r in records(run_dir) if r.get("event") == "train"][1:]
    return statistics.median(rates) / (2 * BATCH)  # the global batch: two ranks or two groups of one


def wait_for(predicate: Callable[[], bool], processes: list[subprocess.Popen[str]]) -> None:
    while not predicate():
        assert all(p.poll() is None for p in processes), "a replica group exited early"
        time.sleep(0.1)


if __name__ == "__main__":
    main()
