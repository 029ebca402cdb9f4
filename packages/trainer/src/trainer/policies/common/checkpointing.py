"""Activation checkpointing of one module's forward, in place: the engine's `--accelerator.activation_checkpointing`
of the wrap units (distributed/units.py) and a policy's own flag (pi0's `gradient_checkpointing`) use it."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint


def checkpointed(forward: Callable[..., Any]) -> Callable[..., Any]:
    """`forward` that keeps only its inputs for backward and recomputes the rest there (torch's
    non-reentrant checkpoint, which replays the RNG state, so dropout masks repeat). Without grad
    (evaluation, select_action) there is nothing to save and it runs as is. Assigned to a module's
    `forward` on the instance, the module tree and its state_dict keys stay as they are."""

    @functools.wraps(forward)
    def checkpointed_forward(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return checkpointed_forward
