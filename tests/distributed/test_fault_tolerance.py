"""Fault tolerance with real processes (gloo on CPU, docs/fault_tolerance.md): torchft's Lighthouse as
`trainer lighthouse` starts it, and replica groups of `trainer train` under torchrun meeting on it.

Every wait is for a state (a line printed, a process exited), bounded; every process started here is
stopped by the fixture that started it.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import ckpt_tools
from helpers.launch import launch_env, run_torchrun

pytestmark = pytest.mark.distributed

TRAINER = Path(sys.executable).with_name("trainer")
SCRIPT = Path(__file__).parent / "scripts" / "train_cli.py"


@contextlib.contextmanager
def lighthouse(min_replicas: int, *flags: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`trainer lighthouse` on a free port: the process and the address it printed; stopped at exit."""
    process = subprocess.Popen(
        [TRAINER, "lighthouse", "--bind=127.0.0.1:0", f"--min_replicas={min_replicas}", *flags],
        env=launch_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        yield process, _read_address(process)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)


def _read_address(process: subprocess.Popen[str]) -> str:
    """The address line, waiting at most 60 s for it (the import of the CLI, the bind)."""
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], 60)
    line = process.stdout.readline() if ready else ""
    assert line.startswith("lighthouse: http://"), f"no address from trainer lighthouse: {line!r}"
    return line.split()[1]


def test_trainer_lighthouse_serves_quorums_until_sigterm() -> None:
    """The command prints an address a torchft client forms a quorum at, and SIGTERM stops it (exit 0)."""
    from torchft._torchft import LighthouseClient

    with lighthouse(1) as (process, address):
        client = LighthouseClient(address, connect_timeout=timedelta(seconds=30))
        quorum = client.quorum(replica_id="probe", timeout=timedelta(seconds=30), step=3, world_size=1)
        assert [(member.replica_id, member.step) for member in quorum.participants] == [("probe", 3)]
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0


def test_trainer_lighthouse_refuses_a_bad_flag_in_one_line() -> None:
    result = subprocess.run(
        [TRAINER, "lighthouse", "--min_replicas=0"],
        env={**os.environ},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stderr.strip() == "error: --min_replicas must be a whole number >= 1, got '0'"


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


@pytest.fixture(scope="module")
def two_groups(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two replica groups of one process each meeting on a Lighthouse, without a failure, and the same
    run as plain 2-rank DDP: group0/, group1/, ddp/ under the returned directory."""
    root = tmp_path_factory.mktemp("ft_two_groups")
    cache = f"--dataset.cache_dir={root / 'cache'}"
    run_torchrun(SCRIPT, 2, *TINY, cache, f"--output_dir={root / 'ddp'}", timeout=240)
    with lighthouse(2) as (_, address):
        groups = [
            start_group(
                root / f"group{r}.log",
                *TINY,
                cache,
                f"--output_dir={root / f'group{r}'}",
                *group_flags(address, r),
            )
            for r in (0, 1)
        ]
        codes = finish(groups, timeout=240)
    logs = "\n".join((root / f"group{r}.log").read_text() for r in (0, 1))
    assert codes == [0, 0], logs
    return root


def test_two_groups_train_as_plain_ddp_does(two_groups: Path) -> None:
    """The gradients are averaged over the groups and each reads its replica id's share of the data:
    the weights equal 2-rank DDP's, and the groups' mean loss is DDP's loss at every step."""
    reference = final_weights(two_groups / "ddp")
    for r in (0, 1):
        torch.testing.assert_close(final_weights(two_groups / f"group{r}"), reference)
    per_group = [train_losses(two_groups / f"group{r}") for r in (0, 1)]
    assert len(per_group[0]) == 4
    assert [(a + b) / 2 for a, b in zip(*per_group, strict=True)] == pytest.approx(
        train_losses(two_groups / "ddp")
    )
    assert per_group[0] != per_group[1]  # each group read its own half of every global batch
    step = ckpt_tools.read_training_step(str(two_groups / "group1" / "checkpoints" / "000004"))
    assert (step.sampler.epoch, step.sampler.offset) == (0, 4 * 8 * 2)  # the global order, both groups' share


def test_the_quorum_is_recorded_in_metrics(two_groups: Path) -> None:
    """The membership is logged once, at the first step: both groups, each with its rank in the quorum."""
    quorums = [[r for r in records(two_groups / f"group{g}") if r.get("event") == "quorum"] for g in (0, 1)]
    assert [[(q["step"], q["replicas"]) for q in group] for group in quorums] == [[(1, 2)], [(1, 2)]]
    assert sorted(group[0]["replica_rank"] for group in quorums) == [0, 1]
