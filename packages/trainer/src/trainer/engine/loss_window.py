"""The training loss between two log steps, each step's too, and the throughput over the same window."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from accelerate import Accelerator


class LossWindow:
    """Losses kept on the device as the steps run (reading a value back would wait for the device at
    every step); `close()` reduces them over the ranks when the loop logs, in one collective."""

    def __init__(self, device: torch.device) -> None:
        self._total = torch.zeros((), device=device)
        self._losses: list[torch.Tensor] = []
        self._start = time.perf_counter()

    def add(self, loss: torch.Tensor) -> None:
        self._total += loss.detach()
        self._losses.append(loss.detach().reshape(1))

    @property
    def steps(self) -> int:
        """The steps added since the window opened."""
        return len(self._losses)

    def close(self, accelerator: Accelerator, global_batch: int) -> tuple[float, list[float], float]:
        """Collective. The window's mean loss over every rank, each step's mean over the ranks (the loss
        curve draws every step, not only the logged ones) and the samples per second; the next window
        starts now. The mean is the running sum's over the steps, as before each step's loss was kept:
        the steps ride along in the same reduction, element by element, so the logged value is unchanged."""
        steps = len(self._losses)
        window = torch.cat([(self._total / steps).reshape(1), *self._losses]).to(torch.float32)
        reduced = accelerator.reduce(window, reduction="mean").tolist()
        samples_per_s = steps * global_batch / (time.perf_counter() - self._start)
        self._total.zero_()
        self._losses, self._start = [], time.perf_counter()
        return reduced[0], reduced[1:], samples_per_s
