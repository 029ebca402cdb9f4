"""What the fault-tolerance tests share (tests/distributed/test_fault_tolerance*.py): torchft's
Lighthouse as `trainer lighthouse` starts it, replica groups of `trainer train`, and the records a
group leaves in its metrics.jsonl."""

from __future__ import annotations

import contextlib
import json
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors.torch import load_file

from helpers.launch import launch_env

TRAINER = Path(sys.executable).with_name("trainer")


@contextlib.contextmanager
def lighthouse(
    min_replicas: int, *flags: str, bind: str = "127.0.0.1:0"
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`trainer lighthouse` on `bind` (a free port unless told): the process and the address it printed;
    stopped at exit."""
    process = subprocess.Popen(
        [TRAINER, "lighthouse", f"--bind={bind}", f"--min_replicas={min_replicas}", *flags],
        env=launch_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        yield process, read_address(process)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)


def read_address(process: subprocess.Popen[str]) -> str:
    """The address line, waiting at most 60 s for it (the import of the CLI, the bind)."""
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], 60)
    line = process.stdout.readline() if ready else ""
    assert line.startswith("lighthouse: http://"), f"no address from trainer lighthouse: {line!r}"
    return line.split()[1]


TINY = (
    "--policy.type=mlp",
    "--dataset.episodes=4",
    "--dataset.eval_episodes=0",
    "--steps=4",
    "--log_freq=1",
    "--save_freq=4",
    "--batch_size=8",
)


def group_flags(address: str, replica_id: int, group_size: int = 2) -> list[str]:
    return [
        "--fault_tolerance.enable=true",
        f"--fault_tolerance.group_size={group_size}",
        f"--fault_tolerance.replica_id={replica_id}",
        f"--fault_tolerance.lighthouse={address}",
    ]


def start_group(log: Path, *args: str) -> subprocess.Popen[str]:
    """One replica group: a `trainer train` process of its own (a group of one rank), output to `log`."""
    with log.open("w") as out:
        return subprocess.Popen(
            [TRAINER, "train", *args],
            env={**launch_env(), "RUST_LOG": "warn"},
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )


def finish(groups: list[subprocess.Popen[str]], timeout: float) -> list[int]:
    """Every group's exit code, killing those still running after `timeout` seconds in all."""
    deadline = time.monotonic() + timeout
    try:
        return [group.wait(timeout=max(1.0, deadline - time.monotonic())) for group in groups]
    finally:
        for group in groups:
            if group.poll() is None:
                group.kill()
                group.wait()


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def train_losses(run: Path) -> list[float]:
    return [r["loss"] for r in records(run) if r.get("event") == "train"]


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "checkpoints" / "000004" / "pretrained_model" / "model.safetensors")


def finished_digests(run: Path, groups: int) -> list[list[tuple[int, str]]]:
    """Each group's (step, weights digest) records of the end of its run."""
    return [
        [
            (r["step"], r["weights_sha256"])
            for r in records(run / f"replica_{g}")
            if r.get("event") == "replica_finished"
        ]
        for g in range(groups)
    ]


def logged_step(run_dir: Path) -> int:
    """The last training step a group's metrics.jsonl records (0 before any)."""
    if not (run_dir / "metrics.jsonl").exists():
        return 0
    steps = [r["step"] for r in records(run_dir) if r.get("event") == "train"]
    return steps[-1] if steps else 0


def quorum_records(run_dir: Path) -> list[dict]:
    return (
        [r for r in records(run_dir) if r.get("event") == "quorum"]
        if (run_dir / "metrics.jsonl").exists()
        else []
    )
