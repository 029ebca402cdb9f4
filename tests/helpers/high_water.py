"""A child process's own peak memory, for the bounded-memory tests.

`resource.getrusage(RUSAGE_SELF).ru_maxrss` cannot serve in a child of the test process: Linux carries
the parent's high-water mark across fork and exec, so a child started from pytest (torch imported,
hundreds of MB) reports pytest's peak until it exceeds it, and a growth measured from it reads zero.
`VmHWM` in /proc/self/status belongs to the child's own address space.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

# Prepended to the code the child runs: defines `peak_kib()`.
_PEAK_KIB = """
def peak_kib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
"""


def run_child(code: str, *args: str, timeout: float = 240) -> dict[str, Any]:
    """Run `code` (which may call `peak_kib()` and prints a JSON object as its last line) in a fresh
    process; return that object. A failing child fails the test with its stderr."""
    done = subprocess.run(
        [sys.executable, "-c", _PEAK_KIB + code, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result
