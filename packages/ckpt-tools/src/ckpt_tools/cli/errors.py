"""One mapping from typed errors to a one-line message on stderr and an exit code.

Commands raise; they never print errors themselves. A traceback appears only when `CKPT_DEBUG=1`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TypeVar

from ckpt_tools.errors import CheckpointError

T = TypeVar("T")

EXIT_OK = 0
EXIT_FAILURE = 1  # a checkpoint problem, or verify found problems
EXIT_USAGE = 2  # typer's own exit code for bad flags


def run_guarded(func: Callable[[], T]) -> T:
    """Run a command body; turn expected failures into `error: ...` and exit 1."""
    try:
        return func()
    except (CheckpointError, FileNotFoundError, PermissionError, IsADirectoryError, OSError) as exc:
        if os.environ.get("CKPT_DEBUG") == "1":
            raise
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        raise SystemExit(EXIT_FAILURE) from None
    except KeyboardInterrupt:
        print("error: interrupted; nothing was left half-written under a final name", file=sys.stderr)
        raise SystemExit(130) from None


def _one_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return " ".join(text.split())
