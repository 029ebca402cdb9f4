"""Which of the values a policy's `forward` returns beside the loss are logged: its floats, under its
own names (ACT's `l1_loss` and `kld_loss`, as LeRobot logs them), averaged like the loss by the training
loop (engine/loss_window.py) and by the held-out evaluation (evaluation/validation.py)."""

from __future__ import annotations

from collections.abc import Mapping

import torch


def scalar_metrics(reported: Mapping[str, torch.Tensor | float]) -> dict[str, torch.Tensor | float]:
    """The floats of a policy's report: one-element floating tensors and Python numbers. A vector
    (pi's `loss_per_dim`) is not one logged value, and is left out."""
    return {
        name: value
        for name, value in reported.items()
        if (isinstance(value, torch.Tensor) and value.numel() == 1 and value.is_floating_point())
        or (isinstance(value, int | float) and not isinstance(value, bool))
    }
