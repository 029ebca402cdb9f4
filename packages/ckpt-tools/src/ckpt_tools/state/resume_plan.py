"""Phase 1 of a two-phase resume: compare the saved run with the current one, before `prepare()`.

The plan says what carries over exactly, what changed (one warning listing every change) and what
cannot be made correct (refused, with the reason and the fix). Phase 2, loading model and optimizer
state onto the current topology, is `ckpt_tools.training.load_training_state`.

Sample order is global: every loop step consumes the next `batch_size x dp_world_size` samples of one
per-epoch permutation. So a resume is sample-exact whenever that global batch is unchanged, whatever the
number of ranks; when it changes, training continues at the same sample offset but groups samples into
different steps.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckpt_tools.errors import ResumeRefusedError
from ckpt_tools.format.meta import SamplerPosition, Topology, TrainingStep


@dataclass(frozen=True)
class RunShape:
    """The facts of the current run that a resume is judged against."""

    topology: Topology
    batch_size: int
    grad_accum_steps: int
    mixed_precision: str
    peft: bool = False

    @property
    def dp_world_size(self) -> int:
        return self.topology.dp_world_size

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.dp_world_size


@dataclass(frozen=True)
class ResumePlan:
    """What a resume restores and what it changes."""

    step: int
    sampler: SamplerPosition
    sample_exact: bool
    changes: tuple[str, ...]
    reshard: bool

    @property
    def warning(self) -> str | None:
        """One message for the log, or None when the run continues exactly as it was."""
        if not self.changes:
            return None
        exactness = (
            "the data order is unchanged (same global batch)"
            if self.sample_exact
            else "batches from here on differ from the uninterrupted run (the global batch changed), "
            "though no sample is skipped or repeated within the epoch"
        )
        return f"resuming step {self.step} with changes: {'; '.join(self.changes)}. {exactness}"


def plan_resume(saved: TrainingStep, current: RunShape) -> ResumePlan:
    """Compare `saved` (training_step.json) with `current`; raise `ResumeRefusedError` if it cannot work."""
    _refuse_impossible(saved, current)
    changes = _describe_changes(saved, current)
    return ResumePlan(
        step=saved.step,
        sampler=saved.sampler,
        sample_exact=saved.global_batch_size == current.global_batch_size,
        changes=tuple(changes),
        reshard=saved.topology != current.topology,
    )


def _refuse_impossible(saved: TrainingStep, current: RunShape) -> None:
    if saved.peft != current.peft:
        have, want = ("an adapter", "a full model") if saved.peft else ("a full model", "an adapter")
        raise ResumeRefusedError(
            f"the checkpoint holds {have} but this run trains {want}; resume with the same --peft "
            "settings, or start a new run from its weights with --policy.path"
        )
    for name in ("cp_size", "tp_size"):
        if getattr(current.topology, name) != 1 or getattr(saved.topology, name) != 1:
            raise ResumeRefusedError(f"{name} other than 1 is reserved and not supported yet; set it to 1")


def _describe_changes(saved: TrainingStep, current: RunShape) -> list[str]:
    changes = []
    if saved.topology != current.topology:
        changes.append(f"topology {saved.topology.describe()} -> {current.topology.describe()}")
    pairs = [
        ("dp_world_size", saved.dp_world_size, current.dp_world_size),
        ("batch_size", saved.batch_size, current.batch_size),
        ("grad_accum_steps", saved.grad_accum_steps, current.grad_accum_steps),
        ("mixed_precision", saved.mixed_precision, current.mixed_precision),
    ]
    changes += [f"{name} {old} -> {new}" for name, old, new in pairs if old != new]
    if saved.step % saved.grad_accum_steps:
        changes.append(
            f"step {saved.step} is inside an accumulation window of {saved.grad_accum_steps} steps (an older "
            "release saved it): the window's accumulated gradients were not saved and are lost"
        )
    saved_effective = saved.effective_batch_size
    current_effective = current.global_batch_size * current.grad_accum_steps
    if saved_effective != current_effective:
        changes.append(
            f"effective batch {saved_effective} -> {current_effective} (the learning rate is not rescaled)"
        )
    return changes
