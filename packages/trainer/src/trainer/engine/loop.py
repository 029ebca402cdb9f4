"""The training loop: one code path for a single process, DDP, FSDP2 and HSDP.

Nothing here branches on the rank or the topology. Collectives (prepare, metric reductions, checkpoint
saves, the evaluation rollouts of a sharded policy) run on every rank; main-rank output goes through
the logger that `make_logger` hands out. Resume slots in at the two marked points. `train()` first
resolves the run plan (plan.py); everything after it reads the plan's config and never edits it.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sys
from collections.abc import Callable, Iterator
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import torch

import ckpt_tools
from trainer.config.dataset import Dataset
from trainer.config.train import TrainConfig
from trainer.data.format import remote
from trainer.data.pipeline import loader
from trainer.data.pipeline.processors import Processor, build_processors
from trainer.data.pipeline.sampler import GlobalOrderSampler, MemberTally
from trainer.distributed.factory import build_accelerator, prepare
from trainer.distributed.interrupt import Agreement, Interrupted, Interrupts
from trainer.distributed.runlock import RunLock, watch_launcher
from trainer.distributed.topology import launch_world_size
from trainer.distributed.wrap import WrapPlan, describe_parameters
from trainer.engine import build as model_build
from trainer.engine.banner import data_banner, run_banner
from trainer.engine.checkpoint import resume
from trainer.engine.checkpoint.wing import Checkpoints
from trainer.engine.ema import Ema
from trainer.engine.host_memory import hold_mmap_threshold
from trainer.engine.loss_window import LossWindow
from trainer.engine.plan import RunPlan, resolve_plan
from trainer.engine.run import Run, RunSummary
from trainer.errors import USER_ERRORS, ConfigError
from trainer.evaluation import rollouts as evaluation
from trainer.evaluation import validation
from trainer.evaluation.inference import LoadedPolicy
from trainer.policies.base import optimizer_params
from trainer.reporting.metrics import Logger, make_logger

if TYPE_CHECKING:
    from accelerate import Accelerator
    from accelerate.scheduler import AcceleratedScheduler


def seed_everything(seed: int) -> None:
    """The same seed on every rank: identical initial weights before DDP/FSDP take over."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def train(config: TrainConfig) -> RunSummary:
    """Collective: call on all ranks. Resolves the run plan from `config` (which is never edited: the
    plan holds a resolved copy) and runs its `steps` loop steps; returns the summary.

    Raises `Interrupted` after a SIGTERM/SIGINT (the checkpoint of the step every rank stopped at is
    saved first), and `ConfigError` on every rank when the run directory is held by another run."""
    hold_mmap_threshold()  # before the build allocates: freed tensors leave the process
    seed_everything(config.seed)  # before the plan reads the data, so a dataset plug-in's draws repeat
    plan = resolve_plan(config, launch_world_size())
    interrupts, lock = Interrupts(), RunLock(plan.config.output_dir)
    interrupts.install()
    watch_launcher(_stop_orphan)
    try:
        return _train(plan, interrupts, lock)
    finally:
        lock.release()
        interrupts.restore()


def _train(plan: RunPlan, interrupts: Interrupts, lock: RunLock) -> RunSummary:
    config, topology, notes = plan.config, plan.topology, list(plan.notes)
    run, wrap_plan, resume_point = _build(plan, lock, notes)
    logger = make_logger(
        run.accelerator.is_main_process, config.output_dir, config.steps, run.start_step, config
    )
    logger.banner(
        [
            *run_banner(config, topology, wrap_plan, run.accelerator, len(run.dataset)),
            plan.optimization,
            *data_banner(run),
            describe_parameters(run.model),
        ]
    )
    if resume_point.message:
        logger.note(resume_point.message, event="resume", step=run.start_step, changes=resume_point.changes)
    for note in notes:
        logger.note(note)
    checkpoints = Checkpoints(run, logger, resume_point.step_dir)
    try:
        losses = _run_steps(run, logger, interrupts, checkpoints)
    except Interrupted as stop:
        logger.note(stop.line(), event="interrupted", step=stop.step, checkpoint=stop.checkpoint)
        checkpoints.interrupted()
        logger.close()
        raise
    last_checkpoint = checkpoints.finish()
    with _evaluated_weights(run, logger):
        returns = evaluate(run.accelerator, run.model, run.preprocessor, run.postprocessor, config)
    summary = RunSummary(
        steps=config.steps,
        first_loss=logger.first_loss(losses[0] if losses else float("nan")),  # before any resume
        final_loss=losses[-1] if losses else float("nan"),
        policy_return=returns[0],
        random_return=returns[1],
        last_checkpoint=last_checkpoint,
    )
    episodes = (
        -(-config.dataset.rollout_episodes // run.accelerator.num_processes) * run.accelerator.num_processes
    )
    rollouts = (
        f"evaluation over {episodes} episodes: policy return {returns[0]:.1f}, "
        f"random policy return {returns[1]:.1f}; "
        if episodes
        else ""
    )
    logger.note(
        f"{rollouts}loss {summary.first_loss:.4f} -> {summary.final_loss:.4f}",
        event="summary",
        **summary.__dict__,
    )
    logger.close()  # the loss curve first: a failed publish ends the process
    checkpoints.publish(summary)
    run.accelerator.wait_for_everyone()
    return summary


def _evaluated_weights(run: Run, logger: Logger) -> contextlib.AbstractContextManager[None]:
    """The weights the end-of-run rollouts score: the EMA's with --ema.use_for_eval (said once), else
    the trained ones."""
    if run.ema is None or not run.config.ema.use_for_eval or not run.config.dataset.rollout_episodes:
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


def _build(plan: RunPlan, lock: RunLock, notes: list[str]) -> tuple[Run, WrapPlan | None, resume.ResumePoint]:
    """Collective. Policy, accelerator, the run lock, optimizer; the two resume phases around
    `prepare()`. A stale lock taken over adds its warning to `notes`."""
    config, topology, dataset = plan.config, plan.topology, plan.dataset
    # on the meta device where it can be; --policy.path weights, --peft adapters, unit transforms
    built = model_build.build(config, topology.is_sharded, dataset.obs_dim, dataset.action_dim, notes)
    policy, wrap_plan = built.policy, built.wrap_plan
    preprocessor, postprocessor = build_processors(config.policy.normalization_stats(dataset.stats()))
    accelerator = build_accelerator(config, topology, wrap_plan)
    model_build.before_prepare(built, config, accelerator.device)  # the unsharded policy is real now
    # while the launcher's store is up (ranks it leaves behind still save), bounded like every collective
    ckpt_tools.prepare_save_groups(timedelta(seconds=config.collective_timeout_s))
    lock_note = ckpt_tools.main_decides(
        lock.acquire, error=ConfigError, expected=USER_ERRORS
    )  # before anything is written to output_dir
    if lock_note:
        notes.append(lock_note)
    sampler = GlobalOrderSampler(
        len(dataset),
        config.batch_size,
        topology.dp_world_size,
        accelerator.process_index,
        config.seed,
        weighted=getattr(dataset, "weighted_order", None),  # a mixture's members drawn by weight
    )
    optimizer = config.optimizer.build(optimizer_params(policy, built.base))
    scheduler = config.scheduler.build(optimizer, config.steps)

    # ---- Resume, phase 1 (before prepare): restore the step, the RNG and the sampler position. ----
    resume_point = resume.before_prepare(
        config, topology, policy, sampler, accelerator.process_index, accelerator.num_processes
    )

    model, optimizer, scheduler = prepare(accelerator, policy, optimizer, scheduler, wrap_plan)
    model_build.after_prepare(built, config, accelerator.device)  # a sharded policy's shards are real now

    # ---- Resume, phase 2 (after prepare): load model/optimizer/scheduler/EMA state (ckpt_tools). ----
    unwrapped = accelerator.unwrap_model(model)
    ema = Ema(config.ema, unwrapped) if config.ema.enable else None
    ema_loaded = resume.after_prepare(
        resume_point,
        model=unwrapped,
        optimizer=optimizer,
        scheduler=scheduler,
        scaler=accelerator.scaler,
        ema=ema.shadow if ema is not None else None,
    )
    if ema is not None and resume_point.step_dir is not None and not ema_loaded:
        ema = Ema(config.ema, unwrapped)  # from the resumed weights
        notes.append(f"{resume_point.step_dir} holds no EMA weights: the EMA starts from its weights")
    # accelerate counts accumulation windows from its own start: count them from step 0 instead, so a
    # resumed run's windows end where the uninterrupted run's do (docs/resume.md).
    accelerator.step = resume_point.start_step
    run = Run(
        config=config,
        topology=topology,
        accelerator=accelerator,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        sampler=sampler,
        dataset=dataset,
        val_dataset=plan.val_dataset,
        preprocessor=preprocessor,
        postprocessor=postprocessor,
        start_step=resume_point.start_step,
        check_lock=lock.check,
        ema=ema,
    )
    return run, wrap_plan, resume_point


def _run_steps(run: Run, logger: Logger, interrupts: Interrupts, checkpoints: Checkpoints) -> list[float]:
    """Collective. The loop steps from `run.start_step`: the step, the log, the saves. Returns the
    logged losses. Every rank checks for a signal at each optimizer-update
    boundary (the check's all-reduce starts inside the step) and stops at the same step."""
    config, accelerator = run.config, run.accelerator
    accum = config.accelerator.gradient_accumulation.steps
    losses: list[float] = []
    grad_norm: torch.Tensor | None = None  # of the last optimizer update, read back when logged
    window = LossWindow(accelerator.device)
    weighted = run.sampler.weighted
    tally = MemberTally(weighted) if weighted is not None else None  # a mixture's samples per member
    run.model.train()
    steps = range(run.start_step + 1, config.steps + 1)
    feed = _batches(run, steps)
    for step in steps:
        boundary = step % accum == 0 or step == config.steps
        agreement: list[Agreement] = []
        check = partial(_start_agreement, agreement, interrupts, accelerator.device, checkpoints)
        loss, norm = _train_step(run, run.preprocessor(next(feed)), check if boundary else None)
        if tally is not None:
            tally.add(run.sampler.last_global)
        if norm is not None:  # an optimizer update: the schedule catches up with the loop steps
            grad_norm = norm
            _advance_schedule(run.scheduler, step)
            if run.ema is not None:  # after the update, once per update (not per micro-batch)
                run.ema.update(step // accum)
        window.add(loss)
        logger.advance()
        if step % config.log_freq == 0 or step == config.steps:
            losses.append(_log_window(run, logger, step, window, grad_norm, tally))
        if run.val_dataset is not None and (
            step == config.steps or (config.eval_freq and step % config.eval_freq == 0)
        ):
            _log_val_loss(run, run.val_dataset, logger, step)
        checkpoints.after_step(step)
        if boundary:
            checkpoints.at_boundary(step, agreement[0])
    return losses


def _batches(run: Run, steps: range) -> Iterator[dict[str, torch.Tensor]]:
    """This rank's batches of `steps` in the global sample order, on the training device, augmented
    when the data says so (data/pipeline/loader.py); the preprocessor runs on them there (cameras arrive as
    uint8, or as augmented floats)."""
    config, accelerator = run.config, run.accelerator
    settings = loader.LoaderSettings(
        config.num_workers,
        config.prefetch_factor,
        config.collective_timeout_s,
        pin_memory=accelerator.device.type == "cuda",
    )
    augment = config.dataset.augmentation(config.seed, accelerator.process_index)
    return loader.batches(
        run.dataset, run.sampler, steps, config.policy.chunk_size, settings, accelerator.device, augment
    )


def _start_agreement(
    into: list[Agreement], interrupts: Interrupts, device: torch.device, checkpoints: Checkpoints
) -> None:
    """Take this rank's flags now (a signal received so far; whether its background checkpoint write
    is still running) and start their all-reduce; the loop waits for it at the boundary."""
    into.append(interrupts.start_agreement(device, checkpoints.writing()))


def _log_window(
    run: Run,
    logger: Logger,
    step: int,
    window: LossWindow,
    grad_norm: torch.Tensor | None,
    tally: MemberTally | None,
) -> float:
    """Collective. Log the window's reduced loss (and the last update's gradient norm, a mixture's
    samples per member in the window: `samples/<member>`, a streamed dataset's retried GETs so far:
    `stream_retries`, this rank's); returns the loss."""
    loss, samples_per_s = window.close(run.accelerator, run.sampler.global_batch)
    norm = {"grad_norm": _read_norm(grad_norm)} if grad_norm is not None else {}
    lr = run.scheduler.get_last_lr()[0]
    logger.log(
        {
            "step": step,
            "loss": loss,
            **norm,
            "lr": lr,
            "samples_per_s": samples_per_s,
            "epoch": run.sampler.position[0],
            **(tally.take() if tally is not None else {}),
            **({} if remote.retry_count() is None else {"stream_retries": remote.retry_count()}),
        }
    )
    return loss


def _log_val_loss(run: Run, held_out: Dataset, logger: Logger, step: int) -> None:
    """Collective. The held-out loss, on the console and in metrics.jsonl (`"event": "val"`); for a
    mixture each member's too (`val_loss/<member>`), val_loss being their mean weighted by frames."""
    weighted = getattr(held_out, "weighted_order", None)
    spans = (
        [(0, len(held_out))]
        if weighted is None
        else [(int(a), int(a + n)) for a, n in zip(weighted.starts, weighted.sizes, strict=True)]
    )
    config = run.config
    losses = [
        validation.held_out_loss(
            run.accelerator,
            run.model,
            held_out,
            run.preprocessor,
            config.batch_size,
            config.policy.chunk_size,
            span,
        )
        for span in spans
    ]
    if weighted is None:
        loss, per_member = losses[0], {}
    else:
        frames = [stop - start for start, stop in spans]
        loss = sum(value * n for value, n in zip(losses, frames, strict=True)) / sum(frames)
        per_member = {
            f"val_loss/{label}": value for label, value in zip(weighted.labels, losses, strict=True)
        }
    text = "".join(f" {name}={value:.4g}" for name, value in per_member.items())
    logger.note(f"step {step} val_loss={loss:.4g}{text}", event="val", step=step, val_loss=loss, **per_member)


def _train_step(
    run: Run, batch: dict[str, torch.Tensor], before_update: Callable[[], None] | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One micro-batch; the optimizer updates when accelerate says the accumulation is complete.
    Returns the loss and, on a step that updated, the global gradient norm before clipping, both as
    tensors: reading a value back waits for the device, so the loop does it only when it logs.
    `before_update()` (the boundary's signal check) is called after the backward, so its all-reduce
    completes while the optimizer steps instead of adding a synchronization point of its own."""
    accelerator, model, clip = run.accelerator, run.model, run.config.optimizer.grad_clip_norm
    grad_norm = None
    with accelerator.accumulate(model):
        loss, _ = model(batch)
        accelerator.backward(loss)
        if accelerator.sync_gradients:  # an infinite threshold measures the norm without clipping
            norm = accelerator.clip_grad_norm_(model.parameters(), clip if clip > 0 else float("inf"))
            grad_norm = norm.detach()
        if before_update is not None:
            before_update()
        run.optimizer.step()
        run.optimizer.zero_grad()
    return loss.detach().float(), grad_norm


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


@torch.no_grad()
def evaluate(
    accelerator: Accelerator,
    model: torch.nn.Module,
    preprocessor: Processor,
    postprocessor: Processor,
    config: TrainConfig,
) -> tuple[float, float]:
    """Collective: call on all ranks. Mean return of the policy and of random torques on the same
    start states (`evaluation.rollout_returns`: split across ranks, every rank running as many, since a
    sharded policy's select_action gathers parameters with the others)."""
    policy = accelerator.unwrap_model(model)
    policy.eval()
    acting = LoadedPolicy(policy, preprocessor, postprocessor, accelerator.device)

    def act(observation: dict[str, np.ndarray | str]) -> np.ndarray:
        return acting.select_action(observation).cpu().numpy()

    def reduce(totals: torch.Tensor) -> torch.Tensor:
        return accelerator.reduce(totals.to(accelerator.device), reduction="sum").cpu()

    world, rank = accelerator.num_processes, accelerator.process_index
    camera = config.dataset.rollout_camera
    result = evaluation.rollout_returns(
        act, config.dataset.rollout_episodes, world, rank, reduce, camera, policy.reset
    )
    policy.train()
    return result["policy_return"], result["random_return"]
