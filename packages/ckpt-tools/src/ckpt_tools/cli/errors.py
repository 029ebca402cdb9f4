"""One mapping from typed errors to a one-line message on stderr and an exit code.

Commands raise; they never print errors themselves. A traceback appears only when `CKPT_DEBUG=1`.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import NoReturn, TypeVar

import typer

from ckpt_tools.errors import CheckpointError, UsageError, one_line

T = TypeVar("T")

EXIT_OK = 0
EXIT_FAILURE = 1  # a checkpoint problem, or verify found problems
EXIT_USAGE = 2  # typer's own exit code for bad flags


def run_guarded(func: Callable[[], T], *, as_json: bool = False) -> T:
    """Run a command body; turn expected failures into `error: ...` on stderr (with `as_json`, a
    `{"error": ...}` document on stdout, for scripts) and the exit code: 1, 2 for a bad option value
    (`UsageError`, typer's `BadParameter`)."""
    try:
        try:
            return func()
        except UsageError as exc:  # the caller's request, not the checkpoint: typer's usage error (2)
            raise typer.BadParameter(str(exc)) from None
    except (CheckpointError, FileNotFoundError, PermissionError, IsADirectoryError, OSError) as exc:
        if os.environ.get("CKPT_DEBUG") == "1":
            raise
        _fail(one_line(exc, expected=(Exception,)), EXIT_FAILURE, as_json)
    except typer.BadParameter as exc:
        if not as_json:
            raise  # typer prints its usage box
        _fail(one_line(exc.format_message()), EXIT_USAGE, as_json)
    except MemoryError:  # a limit (ulimit -v, a cgroup) below what the command needed
        if os.environ.get("CKPT_DEBUG") == "1":
            raise
        _fail(
            "out of memory: the command needed more memory than this process may use; raise the limit "
            "(ulimit -v, the job's memory) or run it on a larger machine; nothing was left half-written",
            EXIT_FAILURE,
            as_json,
        )
    except KeyboardInterrupt:
        _fail("interrupted; nothing was left half-written under a final name", 130, as_json)


def _fail(message: str, code: int, as_json: bool) -> NoReturn:
    if as_json:
        sys.stdout.write(json.dumps({"error": message}) + "\n")
    else:
        print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code) from None
