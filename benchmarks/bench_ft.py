"""What per-step fault tolerance costs and what it saves (issue 56, docs/fault_tolerance.md): an MLP
policy on the embedded pendulum data, gloo on CPU, one process per rank or group (OMP_NUM_THREADS=1).

1. Steps per second of two replica groups of one process each under torchft (a Lighthouse waiting for
   both) against the same run as plain 2-rank DDP under torchrun (goal: >= 0.95x), at three step
   lengths: the tiny MLP (~5 ms), and wider MLPs at larger batches (~50 ms and ~250 ms a step). Each
   run's rate is the median of its logged windows' samples/s over the global batch, the first window
   (start-up) left out; the time fault tolerance adds to a step (the quorum at the Lighthouse, the
   exchange across the groups, the group's commit vote) is the difference of the two step times.
2. A failure: two groups train together, group 1 is SIGKILLed at step --kill-at and relaunched at once
   (as `torchrun --max-restarts` would, --resume=true): the steps group 0 trained while group 1 was
   down (goal: it never stops), how long it stalled before training alone (the Lighthouse's
   --heartbeat_timeout_ms), the time until group 1 was back in the quorum, and the steps lost: the
   survivor's (the one step that failed, trained again).
3. The same failure without fault tolerance, today's path: 2-rank DDP under `torchrun --max-restarts=1
   ... --resume=true`, rank 0 SIGKILLed at step --kill-at: torchrun stops the other rank and restarts
   both, which resume from `last`: the time from the kill until the job trains again (its first logged
   step after the restart) and the steps lost (every step since the save, on every rank).

Usage: python benchmarks/bench_ft.py [--parts overhead,kill,restart] [--sizes 0,1,2] [--steps 800] [--kill-steps 4000]
       [--kill-at 300] [--save-freq 200] [--workdir DIR]
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

import ckpt_tools

TRAINER = str(Path(sys.executable).with_name("trainer"))
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
BATCH = 8
TINY = [
    "--policy.type=mlp",
    "--dataset.episodes=4",
    "--dataset.eval_episodes=0",
    "--log_freq=10",
]
STEP_SIZES = [
    # (what, policy flags, batch size per rank, share of --steps)
    ("tiny MLP", [], BATCH, 1.0),
    ("MLP 512 x 4 blocks", ["--policy.hidden_dim=512", "--policy.blocks=4"], 256, 0.2),
    ("MLP 1024 x 4 blocks", ["--policy.hidden_dim=1024", "--policy.blocks=4"], 256, 0.07),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="overhead,kill,restart")
    parser.add_argument("--sizes", default="0,1,2", help="which STEP_SIZES part 1 runs, by index")
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--kill-steps", type=int, default=4000)
    parser.add_argument("--kill-at", type=int, default=300)
    parser.add_argument("--save-freq", type=int, default=200)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-ft-"))
    common = [*TINY, f"--dataset.cache_dir={workdir / 'cache'}"]
    parts = args.parts.split(",")
    if "overhead" in parts:
        for size in map(int, args.sizes.split(",")):
            what, policy, batch, share = STEP_SIZES[size]
            steps = max(40, int(args.steps * share))
            overhead(workdir / f"size{size}", what, [*common, *policy, f"--batch_size={batch}"], steps)
    failure = [*common, f"--batch_size={BATCH}", f"--save_freq={args.save_freq}", "--resume=true"]
    if "kill" in parts:
        kill_and_heal(
            workdir / "kill", [*failure, f"--steps={args.kill_steps}"], args.kill_at, args.save_freq
        )
    if "restart" in parts:
        restart_from_last(workdir / "restart", [*failure, f"--steps={args.kill_steps}"], args.kill_at)


def overhead(workdir: Path, what: str, flags: list[str], steps: int) -> None:
    """Part 1 at one step length: 2-rank DDP, then two groups under torchft, the same flags."""
    batch = int(next(flag for flag in flags if flag.startswith("--batch_size=")).split("=")[1])
    plain = workdir / "ddp"
    workdir.mkdir(parents=True, exist_ok=True)
    with (workdir / "ddp.log").open("w") as log:
        subprocess.run(
            [*TORCHRUN, TRAINER, "train", *flags, f"--steps={steps}", f"--output_dir={plain}"],
            check=True,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    ft = workdir / "ft"
    lighthouse, address = start_lighthouse(2)
    try:
        groups = [start_group(ft, r, address, [*flags, f"--steps={steps}"]) for r in (0, 1)]
        assert [group.wait(timeout=1800) for group in groups] == [0, 0], "a replica group failed"
    finally:
        lighthouse.kill()
    with_ft, without = steps_per_s(ft / "replica_0", batch), steps_per_s(plain, batch)
    overhead_ms = 1000 * (1 / with_ft - 1 / without)
    print(
        f"{what}, batch {batch} per rank: plain 2-rank DDP {1000 / without:.1f} ms a step, 2 groups with "
        f"fault tolerance {1000 / with_ft:.1f} ms: {with_ft / without:.2f}x (goal >= 0.95x), "
        f"{overhead_ms:.1f} ms more per step"
    )


def kill_and_heal(out: Path, flags: list[str], kill_at: int, save_freq: int) -> None:
    """Part 2: group 1 SIGKILLed at `kill_at` and relaunched at once; group 0's records say the rest."""
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


def restart_from_last(out: Path, flags: list[str], kill_at: int) -> None:
    """Part 3: today's path on the same failure. Rank 0 (the run lock's pid) SIGKILLed once it logged
    `kill_at`; torchrun restarts both ranks, which resume from `last`."""
    out.mkdir(parents=True, exist_ok=True)
    with (out.parent / "restart.log").open("w") as log:
        job = subprocess.Popen(
            [*TORCHRUN, "--max-restarts=1", TRAINER, "train", *flags, f"--output_dir={out}"],
            # docs/resume.md: a relaunched gloo worker must not read the dead attempt's address
            env={**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"},
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        wait_for(lambda: logged_step(out) >= kill_at, [job])
        pid = json.loads((out / "trainer.lock").read_text())["pid"]
        killed_at, last = logged_step(out), ckpt_tools.latest_step_dir(str(out))
        os.kill(pid, signal.SIGKILL)
        killed_time = time.time()
        wait_for(lambda: trains_since(out, killed_time), [job])
        back_s = time.time() - killed_time
        assert job.wait(timeout=1800) == 0, "the restarted job failed"
    finally:
        if job.poll() is None:
            job.kill()
    saved = int(Path(last).name) if last else 0
    print(f"torchrun --max-restarts: rank 0 killed after its step {killed_at}; `last` was step {saved}")
    print(f"  every rank idle until the job trained again: {back_s:.1f} s after the kill")
    print(f"  steps lost: {killed_at - saved} on every rank (trained again from `last`)")


def trains_since(run_dir: Path, moment: float) -> bool:
    """The run started again after `moment` (a new start record) and has logged a step since."""
    found = records(run_dir)
    starts = [i for i, r in enumerate(found) if r.get("event") == "start" and r["time"] > moment]
    return bool(starts) and any(r.get("event") == "train" for r in found[starts[-1] :])


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


def steps_per_s(run_dir: Path, batch: int) -> float:
    """The median of the logged windows' rates, the first window (start-up) left out."""
    rates = [r["samples_per_s"] for r in records(run_dir) if r.get("event") == "train"][1:]
    return statistics.median(rates) / (2 * batch)  # the global batch: two ranks or two groups of one


def wait_for(predicate: Callable[[], bool], processes: list[subprocess.Popen[str]]) -> None:
    while not predicate():
        assert all(p.poll() is None for p in processes), "a replica group exited early"
        time.sleep(0.1)


if __name__ == "__main__":
    main()
