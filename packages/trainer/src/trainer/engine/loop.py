"""The training loop: one code path for a single process, DDP, FSDP2 and HSDP.

Nothing here branches on the rank or the topology. Collectives (prepare, metric reductions, checkpoint
saves, the evaluation rollouts of a sharded policy) run on every rank; main-rank output goes through
the logger that `make_logger` hands out. `train(plan, data)` runs a resolved plan (engine/plan.py) on the
data it read: the run is
built by startup.py (the resume phases included), the data comes from the feed, each step is trained
and committed by committed_step.py, the saves go through the checkpoint wing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from functools import partial
from typing import TYPE_CHECKING

import torch

from trainer.config.sections import LoopSection, RunPlan
from trainer.distributed.interrupt import Agreement, Interrupted, Interrupts
from trainer.distributed.runlock import RunLock, watch_launcher
from trainer.engine.banner import run_banner
from trainer.engine.checkpoint.wing import Checkpoints
from trainer.engine.committed_step import AccumulationWindow, committed_step
from trainer.engine.loss_window import LossWindow
from trainer.engine.run import Run, RunData
from trainer.engine.startup import start_run
from trainer.evaluation.rollouts import score_at_end
from trainer.evaluation.validation import val_losses
from trainer.reporting.metrics import Logger, make_logger
from trainer.reporting.summary import RunSummary

if TYPE_CHECKING:
    from accelerate.scheduler import AcceleratedScheduler


def train(plan: RunPlan, data: RunData) -> RunSummary:
    """Collective: call on all ranks. Runs the plan's `steps` loop steps on `data`; returns the summary.

    Raises `Interrupted` after a SIGTERM/SIGINT (the checkpoint of the step every rank stopped at is
    saved first), and `ConfigError` on every rank when the run directory is held by another run."""
    interrupts, lock = Interrupts(), RunLock(plan.tracking.output_dir)  # a replica group's own
    interrupts.install()
    watch_launcher(_stop_orphan)
    try:
        return _train(plan, data, interrupts, lock)
    finally:
        lock.release()
        interrupts.restore()


def _train(plan: RunPlan, data: RunData, interrupts: Interrupts, lock: RunLock) -> RunSummary:
    notes = list(plan.notes)
    started = start_run(plan, data, lock, notes)
    run, resume_point = started.run, started.resume_point
    steps = plan.loop.steps
    main, saving = run.accelerator.is_main_process, plan.saving
    logger = make_logger(
        main, plan.tracking.output_dir, steps, run.start_step, plan.tracking, saving.train_config
    )
    logger.banner(run_banner(plan, data, started.wrap_plan, run.accelerator, run.model))
    if resume_point.message:
        logger.note(resume_point.message, **resume_point.record())
    for note in notes:
        logger.note(note)
    checkpoints = Checkpoints(run, plan.saving, plan.evaluation, logger, resume_point.step_dir)
    try:
        losses = _run_steps(run, plan.loop, logger, interrupts, checkpoints)
    except Interrupted as stop:
        logger.note(stop.line(), event="interrupted", step=stop.step, checkpoint=stop.checkpoint)
        checkpoints.interrupted()
        logger.close()
        raise
    last_checkpoint = checkpoints.finish()
    finished = run.replicas.finish(steps)  # a fault-tolerant group's weights digest
    if finished is not None:
        logger.record(finished)
    evaluation = plan.evaluation
    with _evaluated_weights(run, plan, logger):
        returns = score_at_end(run.accelerator, run.model, run.preprocessor, run.postprocessor, evaluation)
    world = run.accelerator.num_processes
    summary = RunSummary(
        steps=steps,
        first_loss=logger.first_loss(losses[0] if losses else float("nan")),  # before any resume
        final_loss=losses[-1] if losses else float("nan"),
        policy_return=returns[0],
        random_return=returns[1],
        last_checkpoint=last_checkpoint,
        episodes=-(-evaluation.rollout_episodes // world) * world,  # each rank runs as many
    )
    logger.note(summary.line(), event="summary", **summary.__dict__)
    logger.close()  # the loss curve first: a failed publish ends the process
    checkpoints.publish(summary)
    run.accelerator.wait_for_everyone()
    return summary


def _evaluated_weights(run: Run, plan: RunPlan, logger: Logger) -> contextlib.AbstractContextManager[None]:
    """The weights the end-of-run rollouts score: the EMA's with --ema.use_for_eval (said once), else
    the trained ones."""
    if run.ema is None or not plan.evaluation.use_ema or not plan.evaluation.rollout_episodes:
        return contextlib.nullcontext()
    logger.note("evaluating the EMA weights (--ema.use_for_eval=true)")
    return run.ema.swapped_in()


def _stop_orphan(launcher_pid: int) -> None:
    """The launcher died (e.g. `kill -9` of torchrun): stop as on SIGTERM, at an agreed step with a
    checkpoint, instead of training on unsupervised."""
    sys.stderr.write(
        f"rank {os.environ.get('RANK', '0')}: the launcher (pid {launcher_pid}) died: stopping\n"
    )
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGTERM)


def _run_steps(
    run: Run, section: LoopSection, logger: Logger, interrupts: Interrupts, checkpoints: Checkpoints
) -> list[float]:
    """Collective. The loop steps from `run.start_step`, as the loop's own section sets them: the step,
    the log, the saves. Returns the logged losses. Every rank checks for a signal at each optimizer-update
    boundary (the check's all-reduce starts inside the step) and stops at the same step."""
    accelerator, total, accum = run.accelerator, section.steps, section.grad_accum_steps
    clip, log_freq, val_freq = section.grad_clip_norm, section.log_freq, section.val_freq
    losses: list[float] = []
    grad_norm: torch.Tensor | None = None  # of the last optimizer update, read back when logged
    window = LossWindow(accelerator.device)
    run.model.train()
    steps = range(run.start_step + 1, total + 1)
    batches = run.feed.batches(steps)
    accumulating = AccumulationWindow(run.start_step + 1)
    for step in steps:
        boundary = step % accum == 0 or step == total
        if (step - 1) % accum == 0:  # the first loop step of an accumulation window
            accumulating = AccumulationWindow(step)
        agreement: list[Agreement] = []
        check = partial(_start_agreement, agreement, interrupts, accelerator.device, checkpoints)
        loss, metrics, norm = committed_step(
            run, logger, step, accumulating, batches, clip, check if boundary else None
        )
        if norm is not None:  # an optimizer update: the schedule catches up with the loop steps
            grad_norm = norm
            _advance_schedule(run.scheduler, step)
            if run.ema is not None:  # after the update, once per update (not per micro-batch)
                run.ema.update(step // accum)
        if loss is not None:
            window.add(loss, metrics)
        logger.advance()
        if (step % log_freq == 0 or step == total) and window.steps:
            losses.append(_log_window(run, logger, step, window, grad_norm))
        if run.feed.val_dataset is not None and (step == total or (val_freq and step % val_freq == 0)):
            checkpoints.scored(step, _log_val_loss(run, section.val_batch_size, logger, step))
        if run.replicas.saves:  # a fault-tolerant run's lowest live replica group alone
            checkpoints.after_step(step)
        if boundary:
            checkpoints.at_boundary(step, agreement[0])
    return losses


def _start_agreement(
    into: list[Agreement], interrupts: Interrupts, device: torch.device, checkpoints: Checkpoints
) -> None:
    """Take this rank's flags now (a signal received so far; whether its background checkpoint write
    is still running) and start their all-reduce; the loop waits for it at the boundary."""
    into.append(interrupts.start_agreement(device, checkpoints.writing()))


def _log_window(
    run: Run, logger: Logger, step: int, window: LossWindow, grad_norm: torch.Tensor | None
) -> float:
    """Collective. Log the window's reduced loss, the policy's own metrics (averaged like the loss,
    under its names), the last update's gradient norm and the data feed's metrics (a mixture's samples
    per member, retried GETs of a streamed dataset, the wait for data); returns the loss."""
    feed = run.feed
    means = window.close(run.accelerator, feed.sampler.global_batch)
    logger.record({"event": "step_losses", "step": step, "losses": means.step_losses})  # for loss_curve.png
    norm = {"grad_norm": _read_norm(grad_norm)} if grad_norm is not None else {}
    lr = run.scheduler.get_last_lr()[0]
    record = {"step": step, "loss": means.loss, **norm, "lr": lr, "samples_per_s": means.samples_per_s}
    record = {**record, "epoch": feed.sampler.position[0], **feed.metrics()}
    clash = sorted(means.metrics.keys() & record.keys())
    if clash:
        raise ValueError(f"the policy's forward reports {clash[0]!r}, a name the loop logs itself: rename it")
    logger.log({**record, **means.metrics})
    return means.loss


def _log_val_loss(run: Run, batch_size: int, logger: Logger, step: int) -> float:
    """Collective. The held-out loss, on the console and in metrics.jsonl (`"event": "val"`); for a
    mixture each member's too (`val_loss/<member>`), and the policy's own metrics (`val_<name>`).
    Returns the loss."""
    held_out = val_losses(run.accelerator, run.model, run.feed, run.preprocessor, batch_size)
    values = {**held_out.per_member, **{f"val_{name}": value for name, value in held_out.metrics.items()}}
    text = "".join(f" {name}={value:.4g}" for name, value in values.items())
    logger.note(
        f"step {step} val_loss={held_out.loss:.4g}{text}",
        event="val",
        step=step,
        val_loss=held_out.loss,
        **values,
    )
    return held_out.loss


def _read_norm(norm: torch.Tensor) -> float:
    """Collective for a sharded model's norm (a DTensor: its full value is reduced over the mesh)."""
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


def _advance_schedule(scheduler: AcceleratedScheduler, step: int) -> None:
    """Step the LR schedule up to loop step `step`, right after an optimizer update.

    The schedule counts loop steps, but is stepped only after updates: stepping it during an
    accumulation window, before any update, is what torch warns about ("lr_scheduler.step() before
    optimizer.step()"), on every rank. Each update uses the rate of its window's first loop step
    (with no accumulation: of its own step, as before)."""
    while scheduler.scheduler.last_epoch < step:
        scheduler.step()
