"""SIGTERM and SIGINT: stop at a step every rank agrees on, save there, and exit 128+signal.

Slurm and Kubernetes send SIGTERM some time before SIGKILL, torchrun forwards the signal it gets to
every rank, and Ctrl-C is SIGINT. The handler only records the first signal; the loop asks
`Interrupts.agreed()` at every optimizer-update boundary, which all-reduces the recorded signal so that
every rank stops after the same step (a signal reaching one rank a moment later than another would
otherwise make them stop one step apart and pair off their collectives). The loop then saves the
checkpoint of that step collectively and raises `Interrupted`. A second signal ends the process at once.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupted(Exception):
    """The run stopped on a signal after saving `checkpoint` at `step` (None when nothing was saved)."""

    def __init__(self, signum: int, step: int, checkpoint: str | None, resume_hint: str) -> None:
        super().__init__(f"{signal.Signals(signum).name} at step {step}")
        self.signum, self.step, self.checkpoint, self.resume_hint = signum, step, checkpoint, resume_hint

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def line(self) -> str:
        saved = f"checkpoint {self.checkpoint}" if self.checkpoint else "no checkpoint saved"
        return f"interrupted at step {self.step}; {saved}; resume with {self.resume_hint}"


class Interrupts:
    """The run's signal handlers: the first SIGTERM/SIGINT is recorded, a second aborts at once."""

    def __init__(self) -> None:
        self.received = 0
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        """Handlers live in the main thread only; elsewhere (a test calling train() from a thread) the
        run keeps the process's own handling."""
        import threading

        if threading.current_thread() is not threading.main_thread():
            return
        for signum in SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received:
            sys.stderr.write(f"{signal.Signals(signum).name} again: aborting without a checkpoint\n")
            sys.stderr.flush()
            os._exit(128 + signum)
        self.received = signum

    def agreed(self, device: Any, busy: bool = False) -> tuple[int, bool]:
        """Collective when a process group is up: the signal any rank has received (0 when none), and
        whether any rank is `busy` (a background checkpoint write still running), the same on every
        rank: one all-reduce serves both."""
        import torch
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return self.received, busy
        flags = torch.tensor([self.received, int(busy)], dtype=torch.int32, device=device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        return int(flags[0].item()), bool(flags[1].item())
