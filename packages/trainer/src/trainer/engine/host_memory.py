"""Host memory that a freed tensor gives back to the system: glibc's mmap threshold held fixed.

Why: glibc serves an allocation of at least its mmap threshold (128 KiB at start) with a mapping of its
own, returned to the system when freed. But the threshold is dynamic: each time such a mapping is
freed, glibc raises the threshold to its size (up to 32 MiB on 64-bit). Building a large policy frees
many unit-sized tensors (the initialization twins of a meta build, a load's read buffers), so the
threshold climbs within the first second, and from then on every tensor below 32 MiB comes from the
heap, where freed memory stays resident behind whatever was allocated after it. Building a 470 M
policy (1.88 GB of weights) on one process peaked at 2.75 GB that way, at 2.24 GB with the threshold
held at 1 MiB (benchmarks/bench_memory.py).

Holding the threshold (`mallopt(M_MMAP_THRESHOLD, ...)`) also turns glibc's dynamic adjustment off.
Tensors under 1 MiB stay on the heap, where mapping each would cost a system call per allocation.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

MMAP_THRESHOLD_BYTES = 1 << 20
_M_MMAP_THRESHOLD = -3  # malloc.h


@functools.cache
def hold_mmap_threshold(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Fixes glibc's mmap threshold at `threshold` bytes for this process (once; its DataLoader workers
    inherit it when forked). Returns False where the C library is not glibc (musl, macOS), whose
    allocators return large blocks without being told."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold))
