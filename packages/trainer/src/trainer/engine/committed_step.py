"""One loop step as the replica groups agree on it (docs/fault_tolerance.md): the micro-batch's forward
and backward passes and, at the end of its accumulation window, the average across the live groups,
the clipping and the optimizer update when the groups commit the window. A quorum opens each window;
a window that is not committed is trained again, whole, on the micro-batches kept for it; a window
live peers trained already (this group healed from them) is skipped. Without fault tolerance
(`SINGLE_GROUP`) every window is committed the first time and nothing is kept.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from trainer.distributed.heal_state import rng_state, set_rng_state
from trainer.engine.run import Run
from trainer.reporting.metrics import Logger


@dataclass
class AccumulationWindow:
    """The accumulation window being trained (one optimizer update; one loop step without
    accumulation), as the replica groups agree on it."""

    first: int
    """Its first loop step: where its quorum is taken."""
    micro_batches: list[tuple[dict[str, Any], dict[str, torch.Tensor]]] = field(default_factory=list)
    """The micro-batches drawn for it so far, each with the random generators' state its forward pass
    started from, kept only when the window may go uncommitted and be trained again on them, the same
    way (fault tolerance)."""
    skipped: bool = False
    """Live peers trained it already: this group healed from them and skips its steps."""


def committed_step(
    run: Run,
    logger: Logger,
    step: int,
    window: AccumulationWindow,
    batches: Iterator[dict[str, torch.Tensor]],
    clip: float,
    before_update: Callable[[], None] | None,
) -> tuple[torch.Tensor | None, dict[str, torch.Tensor], torch.Tensor | None]:
    """One loop step of `window` as the replica groups agree on it (docs/fault_tolerance.md): a quorum
    opens each window; the window's last step commits it, or, when the groups do not, the whole window
    is trained again on its micro-batches after a new quorum, until it is committed (the first time,
    without fault tolerance). When this group healed from live peers that trained the window, its
    steps are skipped (no loss). The batch is drawn after the window's quorum, so the sampler a peer
    heals from stands at the window's start."""
    if step == window.first:
        window.skipped = _quorum_trained(run, logger, step)
    if window.skipped:
        return _skipped(before_update)
    batch = run.preprocessor(next(batches))
    if run.replicas.may_retry:
        window.micro_batches.append((rng_state(), batch))
    while True:
        loss, metrics, norm = _train_step(run, step, batch, clip, before_update)
        if loss is not None:
            return loss, metrics, norm
        if _quorum_trained(run, logger, window.first):  # not committed: the window again, or healed
            return _skipped(before_update)
        _train_again(run, window)


def _quorum_trained(run: Run, logger: Logger, step: int) -> bool:
    """Collective over the group. The quorum of the window starting at loop step `step` (a membership
    change noted); True when this group healed from live peers that trained the window already."""
    quorum = run.replicas.start_step(step)
    if quorum.changed:
        logger.note(quorum.line(), **quorum.record())
    return quorum.trained


def _skipped(
    before_update: Callable[[], None] | None,
) -> tuple[torch.Tensor | None, dict[str, torch.Tensor], torch.Tensor | None]:
    """A step this group does not train; its window's end still takes the boundary's signal check."""
    if before_update is not None:
        before_update()
    return None, {}, None


def _train_again(run: Run, window: AccumulationWindow) -> None:
    """Collective. The forward and backward passes of the window's micro-batches before its last one
    again, each from the random state it had (the gradients of the uncommitted window were zeroed; the
    weights are those it started from): the same gradients, bit for bit. The random state is then set
    to the last one's, which the caller trains again: those are a whole window of accelerate's count
    of micro-batches, so the last one syncs and updates, as the first time."""
    accelerator, model = run.accelerator, run.model
    for state, batch in window.micro_batches[:-1]:
        set_rng_state(state)
        with accelerator.accumulate(model):
            loss, _ = model(batch)
            accelerator.backward(loss)
    set_rng_state(window.micro_batches[-1][0])


def _train_step(
    run: Run,
    step: int,
    batch: dict[str, torch.Tensor],
    clip: float,
    before_update: Callable[[], None] | None = None,
) -> tuple[torch.Tensor | None, dict[str, torch.Tensor], torch.Tensor | None]:
    """One micro-batch; the optimizer updates when accelerate says the accumulation is complete.
    Returns the loss, what the policy reported beside it and, on a step that updated, the global
    gradient norm before clipping at `clip` (<= 0: no clipping), all as tensors: reading a value back
    waits for the device, so the loop does it only when it logs. `before_update()` (the boundary's
    signal check) is called after the backward, so its all-reduce completes while the optimizer steps
    instead of adding a synchronization point. A step the replica groups do not commit is not applied:
    (None, {}, None)."""
    accelerator, model = run.accelerator, run.model
    grad_norm = None
    with accelerator.accumulate(model):
        loss, metrics = model(batch)
        if accelerator.sync_gradients:  # the window's last backward: the exchange runs beside it
            run.replicas.exchange_during_backward()
        accelerator.backward(loss)
        if accelerator.sync_gradients:  # an infinite threshold measures the norm without clipping
            run.replicas.average_gradients(model)  # over the live replica groups (fault tolerance)
            norm = accelerator.clip_grad_norm_(model.parameters(), clip if clip > 0 else float("inf"))
            grad_norm = norm.detach()
            if not run.replicas.commit(step):
                _drop_unscaled_step(accelerator.scaler)
                run.optimizer.zero_grad()
                return None, {}, None
        if before_update is not None:
            before_update()
        run.optimizer.step()
        run.optimizer.zero_grad()
    return loss.detach().float(), metrics, grad_norm


def _drop_unscaled_step(scaler: torch.amp.GradScaler | None) -> None:
    """The fp16 loss scaler as if the uncommitted step never ran. Clipping unscaled its gradients, and
    GradScaler refuses a second `unscale_()` before an `update()`: `update()` ends the step, and its
    scale and growth count, which the step would have moved, are put back (the scale moves only at
    `update()`, so the state before it is the window's)."""
    if scaler is None or not scaler.is_enabled():
        return
    before = scaler.state_dict()
    scaler.update()
    scaler.load_state_dict(before)
