"""The training loss between two log steps, and the throughput over the same window."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from accelerate import Accelerator


class LossWindow:
    """Losses summed on the device as the steps run (reading a value back would wait for the device at
    every step); `close()` reduces their mean over the ranks when the loop logs."""

    def __init__(self, device: torch.device) -> None:
        self._total = torch.zeros((), device=device)
        self._steps = 0
        self._start = time.perf_counter()

    def add(self, loss: torch.Tensor) -> None:
        self._total += loss
        self._steps += 1

    def close(self, accelerator: Accelerator, global_batch: int) -> tuple[float, float]:
        """Collective. The window's mean loss over every rank and its samples per second; the next
        window starts now."""
        mean = float(accelerator.reduce(self._total / self._steps, reduction="mean"))
        samples_per_s = self._steps * global_batch / (time.perf_counter() - self._start)
        self._total.zero_()
        self._steps, self._start = 0, time.perf_counter()
        return mean, samples_per_s
