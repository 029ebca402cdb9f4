"""Waiting for a state, never for a time: a test that kills, signals or races a run polls for what it
needs (a step committed, a file present, a request seen) until a generous deadline, so a busy machine
makes it slower, never wrong; the deadline fails it in one line naming what never came."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable

import pytest

DEADLINE_S = 240.0  # a tiny run's step on 2 busy cores takes seconds: this is minutes


def wait_for(
    condition: Callable[[], object],
    what: str,
    timeout: float = DEADLINE_S,
    process: subprocess.Popen[str] | subprocess.Popen[bytes] | None = None,
) -> None:
    """Poll `condition` until it is true. Fails the test naming `what` after `timeout` seconds, or as
    soon as `process` (the run the state is awaited from) has exited without reaching it, with the end
    of its output when it writes to a pipe."""
    deadline = time.monotonic() + timeout
    while not condition():
        if process is not None and process.poll() is not None:
            output = process.communicate()[0] if process.stdout is not None else ""
            tail = output[-3000:] if isinstance(output, str) else output[-3000:].decode(errors="replace")
            pytest.fail(f"the process exited ({process.returncode}) before {what}\n{tail}".rstrip())
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout:.0f} s")
        time.sleep(0.05)
