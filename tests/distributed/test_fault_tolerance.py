"""Fault tolerance with real processes (gloo on CPU, docs/fault_tolerance.md): torchft's Lighthouse as
`trainer lighthouse` starts it, and replica groups of `trainer train` under torchrun meeting on it.

Every wait is for a state (a line printed, a process exited), bounded; every process started here is
stopped by the fixture that started it.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from helpers.launch import launch_env

pytestmark = pytest.mark.distributed

TRAINER = Path(sys.executable).with_name("trainer")


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
