"""Waiting for a state, never for a time: a test that kills, signals or races a run polls for what it
needs (a step committed, a file present, a request seen) until a generous deadline, so a busy machine
makes it slower, never wrong; the deadline fails it in one line naming what never came."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence

import pytest

DEADLINE_S = 240.0  # a tiny run's step on 2 busy cores takes seconds: this is minutes


Process = subprocess.Popen[str] | subprocess.Popen[bytes]


def wait_for(
    condition: Callable[[], object],
    what: str,
    timeout: float = DEADLINE_S,
    process: Process | Sequence[Process] | None = None,
) -> None:
    """Poll `condition` until it is true. Fails the test naming `what` after `timeout` seconds, or as
    soon as `process` (the run the state is awaited from, or each of several) has exited without
    reaching it, with the end of its output when it writes to a pipe."""
    watched = [] if process is None else [process] if isinstance(process, subprocess.Popen) else list(process)
    deadline = time.monotonic() + timeout
    while not condition():
        for exited in (p for p in watched if p.poll() is not None):
            output = exited.communicate()[0] if exited.stdout is not None else ""
            tail = output[-3000:] if isinstance(output, str) else output[-3000:].decode(errors="replace")
            pytest.fail(f"{exited.args} exited ({exited.returncode}) before {what}\n{tail}".rstrip())
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout:.0f} s")
        time.sleep(0.05)
