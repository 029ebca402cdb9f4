"""Typed errors of the trainer.

Every error is one line that names the problem and the fix (the flag to change), so the CLI prints it
as is and exits 1 without a traceback.
"""

from __future__ import annotations

import re


class ConfigError(ValueError):
    """The configuration cannot run: a flag, a combination of flags, or the launch environment."""


class WrapPlanError(ConfigError):
    """The FSDP wrap plan cannot shard this policy (no wrap units, or tied weights split across units)."""


class PublishFailedError(ConfigError):
    """The end-of-training publish failed on the main rank; every rank raises it, the checkpoints stay."""


class CheckpointSaveError(ConfigError):
    """A collective save failed on some rank; every rank raises it with the same line, `last` unchanged."""


def backend_detail(exc: BaseException) -> str:
    """A torch store or backend error as a short single line, without gloo's source-file prefix."""
    return " ".join(re.sub(r"^\[[^\]]*\] ", "", str(exc)).split())[:160]
