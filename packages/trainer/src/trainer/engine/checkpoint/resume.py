"""Two-phase resume (docs/resume.md): the trainer's side, over ckpt_tools' plan and loaders.

Phase 1 (`before_prepare`) runs on the plain, freshly built policy: it finds the checkpoint, reads its
`training_step.json`, judges the current run against it (`ckpt_tools.training.plan_resume`: refused, warned,
sample-exact), checks that the saved weights fit the model, and restores the RNG and the sampler's
position. No weights are loaded then: whatever the format, they go in after `prepare()`, where DCP
shards are resharded straight onto the current topology (`after_prepare`, phase 2).

Every failure that the user can fix (a legacy or foreign checkpoint, a refused change, a damaged file)
becomes one `ConfigError` line naming the checkpoint, never a torch traceback.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

import ckpt_tools
from ckpt_tools import TrainingStep, layout
from ckpt_tools.training import ResumePlan, RunShape, Topology
from trainer.config.sections import SavingSection
from trainer.data.pipeline.sampler import GlobalOrderSampler
from trainer.engine.peft_policy import saved_weight_shapes
from trainer.errors import USER_ERRORS, CannotResumeError, ConfigError
from trainer.policies.common.base import Policy

if TYPE_CHECKING:
    from accelerate.scheduler import AcceleratedScheduler


LEROBOT_NOT_CARRIED = (
    "LeRobot's sampler order does not carry over: the data continues at the same sample offset of "
    "this trainer's own order (LeRobot's EpisodeAwareSampler permutes differently)",
)


@dataclass(frozen=True)
class ResumePoint:
    """Where a run starts: `step_dir` is None for a fresh start (step 0)."""

    step_dir: str | None
    plan: ResumePlan | None
    message: str
    lerobot: bool = False
    """The step is a LeRobot run's (LeRobot's layout and tensor names)."""
    batch: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    """The batch factors of the saved run and of this one (`saved`, `now`): `batch_shape`."""

    @property
    def start_step(self) -> int:
        return self.plan.step if self.plan is not None else 0

    @property
    def not_carried(self) -> tuple[str, ...]:
        """What the saved run had that this one cannot restore (a LeRobot run's sampler order)."""
        return LEROBOT_NOT_CARRIED if self.lerobot else ()

    @property
    def changes(self) -> list[str]:
        """The settings that differ from the saved run (empty when it continues exactly)."""
        return list(self.plan.changes) if self.plan is not None else []

    def record(self) -> dict[str, Any]:
        """metrics.jsonl's resume record: where the continuation starts, what changed, and the batch
        before and after, so a run that came back on fewer ranks says what its batch became."""
        record: dict[str, Any] = {"event": "resume", "step": self.start_step, "changes": self.changes}
        if self.not_carried:
            record["not_carried"] = list(self.not_carried)
        if self.plan is not None:  # not a fresh start for want of a checkpoint
            record.update(sample_exact=self.plan.sample_exact, batch=self.batch)
        return record


FRESH = ResumePoint(step_dir=None, plan=None, message="")


def saved_config_path(output_dir: str) -> str | None:
    """`train_config.json` of the run's latest checkpoint (`checkpoints/last`), or None before the
    first save: what `--resume=true --output_dir=DIR` starts from when no --config_path is given."""
    step_dir = resume_pointer(output_dir)
    if step_dir is None:
        return None
    config_path = layout.join(step_dir, layout.PRETRAINED_MODEL_DIR, layout.TRAIN_CONFIG)
    try:
        if ckpt_tools.training.is_lerobot_checkpoint(step_dir):
            ckpt_tools.training.check_lerobot_resumable(step_dir)
            return config_path  # LeRobot's run: cli/lerobot_resume.py reads its config
        ckpt_tools.read_training_step(step_dir)
    except (
        ckpt_tools.training.ResumeRefusedError
    ) as exc:  # another tool's run (LeRobot's): its config is not ours
        raise CannotResumeError(step_dir, str(exc)) from None
    except ckpt_tools.CheckpointError:
        pass  # a damaged step is explained where the resume reads it
    return config_path


def resume_pointer(path: str) -> str | None:
    """The step `last` names under a run's output_dir or `checkpoints/` (None before the first save).
    A `last` that is not a valid pointer to a complete step is a refusal, never "no checkpoint": a
    fresh start would save over the run, and its retention delete the steps it could not find."""
    try:
        return ckpt_tools.latest_step_dir(path)
    except ckpt_tools.CheckpointError as exc:
        raise ConfigError(f"cannot resume from {path}: {exc}") from None


def find_checkpoint(config_path: str | None, output_dir: str) -> str | None:
    """The step directory a `--resume=true` run continues from.

    `--config_path` inside a checkpoint (`<step>/pretrained_model/train_config.json`, `last` included)
    names it; otherwise it is `checkpoints/last` under `--output_dir`, and None when that run has not
    saved yet (the caller then starts fresh, so a crash before the first save also recovers).
    """
    if config_path is not None:
        text = os.fspath(config_path)
        model_dir = layout.parent(text if layout.is_url(text) else os.path.abspath(text))  # URLs too
        if layout.name(model_dir) == layout.PRETRAINED_MODEL_DIR:
            step_dir = layout.parent(model_dir)
            if layout.name(step_dir) == layout.LAST:
                return resume_pointer(layout.parent(step_dir))
            return step_dir
    return resume_pointer(output_dir)


def before_prepare(
    section: SavingSection,
    topology: Topology,
    model: torch.nn.Module,
    sampler: GlobalOrderSampler,
    rank: int,
    world_size: int,
) -> ResumePoint:
    """Phase 1: plan the resume, restore RNG and sampler position. Collective: call on all ranks after
    the process group is up, before `prepare()`. The main rank alone resolves which step to resume
    (`last` may move while the ranks start) and broadcasts it; every rank then reads that step's files
    and computes the same plan."""
    if not section.resume:
        return FRESH
    step_dir = ckpt_tools.training.main_decides(
        lambda: find_checkpoint(section.config_path, section.output_dir),
        error=ConfigError,
        expected=USER_ERRORS,
    )
    if step_dir is None:
        return ResumePoint(
            None,
            None,
            f"--resume=true: no checkpoint under {section.output_dir}: starting a fresh run",
        )
    lerobot = _is_lerobot(step_dir)
    with _refusals(step_dir):
        if lerobot:
            saved = ckpt_tools.training.read_lerobot_training_step(step_dir)
            plan = ckpt_tools.training.plan_resume(saved, _run_shape(section, topology))
            ckpt_tools.training.load_lerobot_rng_state(
                step_dir
            )  # its names are checked when phase 2 renames them
        else:
            saved = ckpt_tools.read_training_step(step_dir)
            plan = ckpt_tools.training.plan_resume(saved, _run_shape(section, topology))
            _check_weights_fit(step_dir, model)
            ckpt_tools.training.load_rng_state(step_dir, rank, world_size)
    if plan.sampler.offset > sampler.num_samples:  # fewer --dataset.episodes than the run saved with
        raise ConfigError(
            f"cannot resume from {step_dir}: its sampler offset {plan.sampler.offset} lies beyond this "
            f"run's dataset of {sampler.num_samples} samples; resume with the dataset it was trained on "
            "(its train_config.json's --dataset.* settings)"
        )
    sampler.set_position(plan.sampler.epoch, plan.sampler.offset)
    lines = [
        f"resuming from {step_dir} at step {plan.step} (epoch {plan.sampler.epoch}, "
        f"sample offset {plan.sampler.offset})"
    ]
    if plan.warning is not None:
        lines.append(f"warning: {plan.warning}")
    shape = _run_shape(section, topology)
    if not plan.sample_exact and saved.batch_size == shape.batch_size:  # the ranks alone changed it
        lines.append(
            f"the global batch follows the number of ranks ({saved.dp_world_size} -> {shape.dp_world_size}); "
            f"--global_batch_size={saved.global_batch_size} keeps the checkpoint's on any number of ranks"
        )
    lines += [f"warning: {line}" for line in LEROBOT_NOT_CARRIED if lerobot]
    if plan.step >= section.steps:
        lines.append(
            f"nothing left to train: the checkpoint is at step {plan.step} of --steps={section.steps}; "
            "raise --steps to continue training"
        )
    batch = {"saved": batch_shape(saved), "now": batch_shape(shape)}
    return ResumePoint(step_dir, plan, "\n".join(lines), lerobot=lerobot, batch=batch)


def batch_shape(run: TrainingStep | RunShape) -> dict[str, int]:
    """A run's batch factors: per-rank batch x data-parallel ranks = global batch, x accumulation."""
    return {
        "batch_size": run.batch_size,
        "dp_world_size": run.dp_world_size,
        "global_batch_size": run.batch_size * run.dp_world_size,
        "grad_accum_steps": run.grad_accum_steps,
    }


def after_prepare(
    point: ResumePoint,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: AcceleratedScheduler,
    scaler: torch.amp.GradScaler | None,
    extra_weights: Mapping[str, Mapping[str, torch.Tensor]] | None = None,
) -> frozenset[str]:
    """Phase 2. Collective: call on all ranks after `prepare()`. Loads model, optimizer, scheduler and
    loss-scaler state into the prepared objects, resharding onto the current topology, and the weight
    sets beside the model in place (`extra_weights` by name: the EMA shadow); returns the names of the
    sets the step held."""
    if point.step_dir is None:
        return frozenset()
    if point.lerobot:
        _load_lerobot_state(point.step_dir, model, optimizer, scheduler)
        return frozenset()
    with _refusals(point.step_dir):
        return ckpt_tools.training.load_training_state(
            point.step_dir,
            model=model,
            optimizer=getattr(optimizer, "optimizer", optimizer),  # accelerate's wrapper holds the real one
            scheduler=getattr(scheduler, "scheduler", scheduler),
            scaler=scaler,
            extra_weights=extra_weights,
        )


def _is_lerobot(step_dir: str) -> bool:
    with _refusals(step_dir):
        return ckpt_tools.training.is_lerobot_checkpoint(step_dir)


def _load_lerobot_state(
    step_dir: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: AcceleratedScheduler
) -> None:
    """Phase 2 of a LeRobot run's resume: its weights and optimizer state renamed by the policy's own
    mapping of LeRobot's tensor names (its adapter's `state_from_lerobot`), sharded onto this run."""
    adapter = model.config.lerobot_adapter() if isinstance(model, Policy) else None
    if adapter is None:
        raise CannotResumeError(
            step_dir, "it is LeRobot's, and only a policy of this trainer with a LeRobot form reads it"
        )
    with _refusals(step_dir):
        try:
            ckpt_tools.training.load_lerobot_training_state(
                step_dir,
                model=model,
                rename=adapter.state_from_lerobot,
                optimizer=getattr(
                    optimizer, "optimizer", optimizer
                ),  # accelerate's wrapper holds the real one
                scheduler=getattr(scheduler, "scheduler", scheduler),
            )
        except (RuntimeError, KeyError, ConfigError) as exc:  # a misfit, as torch's strict load words it
            first = " ".join(str(exc).split())[:300]
            raise CannotResumeError(
                step_dir,
                f"its tensors do not fit this policy ({first}); resume with the policy settings it was "
                "saved with (its pretrained_model/config.json)",
            ) from None


def _run_shape(section: SavingSection, topology: Topology) -> RunShape:
    return RunShape(
        topology=topology,
        batch_size=section.batch_size,
        grad_accum_steps=section.grad_accum_steps,
        mixed_precision=section.mixed_precision,
        peft=section.peft,
    )


def _check_weights_fit(step_dir: str, model: torch.nn.Module) -> None:
    """Compare the saved weights' names and shapes (metadata only) with the freshly built model, so a
    checkpoint of another architecture is refused before any collective load starts."""
    weights = ckpt_tools.describe_checkpoint(step_dir).weights
    if weights is None:
        raise CannotResumeError(step_dir, "it holds no model weights; resume an earlier step")
    saved = {t.name: tuple(t.shape) for t in weights.tensors}
    wanted = saved_weight_shapes(model)  # the adapter's names and shapes on a PEFT model
    missing, unexpected = sorted(wanted.keys() - saved.keys()), sorted(saved.keys() - wanted.keys())
    resized = sorted(name for name in wanted.keys() & saved.keys() if wanted[name] != saved[name])
    if missing or unexpected or resized:
        first = (
            f"missing {missing[0]}"
            if missing
            else f"unexpected {unexpected[0]}"
            if unexpected
            else f"{resized[0]} is {list(saved[resized[0]])} there but {list(wanted[resized[0]])} here"
        )
        raise CannotResumeError(
            step_dir,
            f"its weights do not fit this policy ({len(missing)} missing, {len(unexpected)} unexpected, "
            f"{len(resized)} resized; {first}); resume with the policy settings it was saved with "
            "(its train_config.json)",
        )


@contextlib.contextmanager
def _refusals(step_dir: str) -> Iterator[None]:
    """Turn a checkpoint problem (typed ckpt_tools error, or torch's DCP load failure) into one line."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        yield
    except ckpt_tools.CheckpointError as exc:
        raise CannotResumeError(step_dir, str(exc)) from None
    except CheckpointException as exc:  # a BaseException: per-rank failures of dcp.load
        first = " ".join(str(exc).split())[:300]
        raise CannotResumeError(
            step_dir,
            f"its DCP shards do not load into this run ({first}); "
            "check the checkpoint with `ckpt verify` and resume with the settings it was saved with",
        ) from None
