"""The training loss between two log steps, each step's too, what the policy reports beside the loss,
and the throughput over the same window."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from trainer.reporting.policy_metrics import scalar_metrics

if TYPE_CHECKING:
    from accelerate import Accelerator


@dataclass(frozen=True)
class WindowMeans:
    """A closed window, averaged over the ranks."""

    loss: float
    step_losses: list[float]
    """Each step's loss (the loss curve draws every step, not only the logged ones)."""
    metrics: dict[str, float]
    """The policy's own floats (`scalar_metrics`), under its names, each the window's mean."""
    samples_per_s: float


class LossWindow:
    """Losses and the policy's metrics kept on the device as the steps run (reading a value back would
    wait for the device at every step); `close()` reduces them over the ranks when the loop logs, in one
    collective. Every rank's policy reports the same names at every step (the names the first step
    reported); a step that reports others is a policy error, raised at once rather than as a mismatched
    reduction."""

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self._total = torch.zeros((), device=device)
        self._losses: list[torch.Tensor] = []
        self._metrics: dict[str, torch.Tensor] | None = None  # the names are fixed by the first step
        self._start = time.perf_counter()

    def add(self, loss: torch.Tensor, metrics: Mapping[str, torch.Tensor | float]) -> None:
        """One step's loss and the floats its policy reported (`scalar_metrics` picks them)."""
        self._total += loss.detach()
        self._losses.append(loss.detach().reshape(1))
        floats = scalar_metrics(metrics)
        if self._metrics is None:
            self._metrics = {name: torch.zeros((), device=self._device) for name in floats}
        if floats.keys() != self._metrics.keys():
            raise ValueError(
                f"the policy's forward reported the metrics {sorted(floats)} after {sorted(self._metrics)}: "
                "a policy reports the same names at every step (they are averaged over the ranks together)"
            )
        for name, value in floats.items():
            total = self._metrics[name]
            total += value.detach().reshape(()).to(total.dtype) if isinstance(value, torch.Tensor) else value

    @property
    def steps(self) -> int:
        """The steps added since the window opened."""
        return len(self._losses)

    def close(self, accelerator: Accelerator, global_batch: int) -> WindowMeans:
        """Collective. The window's means over every rank (the loss, the policy's metrics, each step's
        loss) and the samples per second; the next window starts now. The mean loss is the running sum's
        over the steps, as before each step's loss was kept: the steps and the metrics ride along in the
        same reduction, element by element, so the logged loss is unchanged and no collective is added."""
        steps = len(self._losses)
        metrics = self._metrics or {}
        means = [(total / steps).reshape(1) for total in (self._total, *metrics.values())]
        window = torch.cat([*means, *self._losses]).to(torch.float32)
        reduced = accelerator.reduce(window, reduction="mean").tolist()
        samples_per_s = steps * global_batch / (time.perf_counter() - self._start)
        self._total.zero_()
        for total in metrics.values():
            total.zero_()
        self._losses, self._start = [], time.perf_counter()
        count = 1 + len(metrics)
        named = dict(zip(metrics, reduced[1:count], strict=True))
        return WindowMeans(reduced[0], reduced[count:], named, samples_per_s)
