"""Typed errors of the trainer, grouped by what they are.

Every error is one line that names the problem and the fix (the flag to change), so the CLI maps the
base, `TrainerError`, once: it prints the line and exits 1 without a traceback. A `ConfigError` is
found before or while the run is built (a flag, a checkpoint to resume, the launch environment); a
`RunFailedError` happens while it runs (a collective save, the final publish), on every rank alike.
"""

from __future__ import annotations

import re

import ckpt_tools


class TrainerError(Exception):
    """Base of the trainer's errors: one line naming the problem and the fix."""


class ConfigError(TrainerError, ValueError):
    """The configuration cannot run: a flag, a combination of flags, or the launch environment."""


class CannotResumeError(ConfigError):
    """The checkpoint a run resumes from cannot be resumed by it; `step_dir` names the checkpoint."""

    def __init__(self, step_dir: str, reason: str) -> None:
        super().__init__(f"cannot resume from {step_dir}: {reason}")
        self.step_dir, self.reason = step_dir, reason


class RunFailedError(TrainerError):
    """The run failed while running, on every rank with the same line; what was committed stays."""


USER_ERRORS: tuple[type[BaseException], ...] = (TrainerError, ckpt_tools.CheckpointError)
"""Errors whose message is written for the user (ours and ckpt_tools'): `ckpt_tools.one_line` prints
them without their type, and `ckpt_tools.training.main_decides` shares them with every rank as they are."""


class WrapPlanError(ConfigError):
    """The FSDP wrap plan cannot shard this policy (no wrap units, or tied weights split across units)."""


class PublishFailedError(RunFailedError):
    """The end-of-training publish failed on the main rank; every rank raises it, the checkpoints stay."""


class CheckpointSaveError(RunFailedError):
    """A collective save failed on some rank; every rank raises it with the same line, `last` unchanged."""


def backend_detail(exc: BaseException) -> str:
    """A torch store or backend error as a short single line, without gloo's source-file prefix."""
    return " ".join(re.sub(r"^\[[^\]]*\] ", "", str(exc)).split())[:160]
