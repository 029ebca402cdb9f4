"""Typed errors of ckpt-tools.

Every error carries one line that names the problem and the fix, so the CLI can print it as is and a
library caller can show it to a user without a traceback. The CLI maps `UsageError` (the caller asked
for something malformed) to exit 2 and every other `CheckpointError` to exit 1; an unexpected
`ValueError` from inside ckpt-tools is never taken for the user's fault.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Finding:
    """A problem a check lists instead of raising (`ckpt verify` reports every one), with the file or
    directory it is about: a report names each file once by comparing paths, never by searching the
    text of other messages for a file name (which a longer name containing it would match). A path
    of None: about no one file (two weight sets that disagree)."""

    path: str | None
    message: str


class CheckpointError(Exception):
    """Base class: something about a checkpoint (or a request about one) is wrong."""


class UsageError(CheckpointError, ValueError):
    """The request is malformed (an option value, an argument): the caller must change it. `option`
    names the flag or argument when there is one."""

    def __init__(self, message: str, *, option: str | None = None) -> None:
        super().__init__(message)
        self.option = option


class NotACheckpointError(CheckpointError):
    """The path exists but holds none of the files of a checkpoint."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """The path does not exist."""


class CorruptCheckpointError(CheckpointError):
    """A file of the checkpoint is truncated, malformed or inconsistent with the rest."""


class UnsupportedVersionError(CheckpointError):
    """`training_step.json` was written by a newer, unknown format version."""


class LegacyCheckpointError(CheckpointError):
    """An older layout that cannot be resumed (its weights may still be loadable)."""


class UnsafePickleError(CorruptCheckpointError):
    """A pickle (DCP `.metadata`) asked for a class outside the allow-list: refused, never executed."""


class ResumeRefusedError(CheckpointError):
    """The checkpoint cannot be resumed under the current configuration."""


class OutputExistsError(CheckpointError):
    """An output would overwrite existing files without `overwrite=True`."""


class PublishError(CheckpointError):
    """Publishing to the Hub or to an fsspec target failed; nothing local was deleted. `transient` says
    the same publish may succeed later (a server error, a rate limit, an unreachable endpoint), so a
    caller that retries knows which failures are worth retrying."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class ForeignCheckpointError(ResumeRefusedError):
    """Written by another tool (LeRobot): its weights load, but its training state is not ours to resume."""


class SaveFailedError(CheckpointError):
    """A collective save failed (a main-rank write or commit, or a rank's shard write): every rank of
    the save raises it with the same line, and the step was not committed (`last` is unchanged)."""


def one_line(
    error: BaseException | str, expected: tuple[type[BaseException], ...] = (CheckpointError,)
) -> str:
    """An error as the one line a user reads, whitespace folded. An exception whose message is not
    written for the user (not one of `expected`) keeps its type in front: `KeyError: 'x'`."""
    text = " ".join(str(error).split())
    if isinstance(error, BaseException):
        text = text or type(error).__name__
        if not isinstance(error, expected):
            text = f"{type(error).__name__}: {text}"
    return text
