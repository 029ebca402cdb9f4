"""engine/host_memory.py: with glibc's mmap threshold held, tensors freed after a larger one was freed
leave the process; without it, they stay resident on the heap (the control run shows the pattern is the
one that inflated a large policy's first step)."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import sys, torch
from trainer.engine.host_memory import hold_mmap_threshold

def resident():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))

if sys.argv[1] == "hold":
    assert hold_mmap_threshold()
big = torch.ones(24 << 20, dtype=torch.uint8)
del big  # a freed mapping: glibc raises its threshold to 24 MiB unless it is held
before = resident()
blocks = [torch.ones(4 << 20, dtype=torch.uint8) for _ in range(40)]  # 160 MiB
last = blocks.pop()  # kept: the heap cannot shrink below it
del blocks
print((resident() - before) >> 20)
"""


def _retained_mib(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; glibc's allocator")
def test_freed_tensors_leave_the_process_with_the_threshold_held() -> None:
    assert _retained_mib("free") >= 100  # glibc's dynamic threshold: 39 freed 4 MiB blocks stay resident
    assert _retained_mib("hold") <= 12  # the one block kept, and no more
