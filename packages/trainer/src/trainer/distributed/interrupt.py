"""SIGTERM and SIGINT: stop at a step every rank agrees on, save there, and exit 128+signal.

Slurm and Kubernetes send SIGTERM some time before SIGKILL, torchrun forwards the signal it gets to
every rank, and Ctrl-C is SIGINT. The handler only records the first signal; the loop asks
`Interrupts.start_agreement()` at every optimizer-update boundary, which all-reduces the recorded signal so that
every rank stops after the same step (a signal reaching one rank a moment later than another would
otherwise make them stop one step apart and pair off their collectives). The loop then saves the
checkpoint of that step collectively and raises `Interrupted`. A second signal ends the process at once,
unless it comes within REPEAT_WINDOW_S of the first (the same request delivered twice).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGINT)
_signalled: list[int] = []  # every SIGTERM/SIGINT this process got while a run's handlers were installed


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


# A signal this soon after the first is the same request delivered twice, not a second one: Slurm
# signals every process of a job step, ranks included, and torchrun forwards its own copy as well.
REPEAT_WINDOW_S = 2.0


class Interrupts:
    """The run's signal handlers: the first SIGTERM/SIGINT is recorded, a second aborts at once (one
    within REPEAT_WINDOW_S of the first is taken as the same delivery and ignored)."""

    def __init__(self) -> None:
        self.received = 0
        self._first_at = 0.0
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        """Handlers live in the main thread only; elsewhere (a test calling train() from a thread) the
        run keeps the process's own handling."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        _signalled.append(signum)
        if self.received and time.monotonic() - self._first_at < REPEAT_WINDOW_S:
            return
        if self.received:
            sys.stderr.write(f"{signal.Signals(signum).name} again: aborting without a checkpoint\n")
            sys.stderr.flush()
            os._exit(128 + signum)
        self.received, self._first_at = signum, time.monotonic()

    def start_agreement(self, device: Any, busy: bool = False) -> Agreement:
        """Collective when a process group is up: the signal any rank has received (0 when none), and
        whether any rank is `busy` (a background checkpoint write still running), the same on every
        rank: one all-reduce serves both. The flags are taken and the all-reduce started now;
        `result()` waits for it, so the caller's own work runs while the collective completes."""
        import torch
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return Agreement(torch.tensor([self.received, int(busy)]), None)
        flags = torch.tensor([self.received, int(busy)], dtype=torch.int32, device=device)
        return Agreement(flags, dist.all_reduce(flags, op=dist.ReduceOp.MAX, async_op=True))


class Agreement:
    """A started all-reduce of (signal, busy) flags; `result()` is the same on every rank."""

    def __init__(self, flags: Any, work: Any) -> None:
        self.flags, self.work = flags, work

    def result(self) -> tuple[int, bool]:
        if self.work is not None:
            self.work.wait()
        return int(self.flags[0].item()), bool(self.flags[1].item())


def hold_until_signal(seconds: float) -> None:
    """Wait until this process gets SIGTERM or SIGINT, for `seconds` at most; at once when it already
    got one during the run. Both signals are ignored afterwards, so that the caller prints its last
    line and exits undisturbed (the launcher's SIGKILL still ends a process that does not)."""
    if threading.current_thread() is not threading.main_thread():
        return
    got: list[int] = []
    for signum in SIGNALS:
        signal.signal(signum, lambda number, frame: got.append(number))
    deadline = time.monotonic() + seconds
    while not (got or _signalled) and time.monotonic() < deadline:
        time.sleep(0.05)
    for signum in SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
