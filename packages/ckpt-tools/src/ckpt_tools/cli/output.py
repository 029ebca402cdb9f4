"""One output object with human, json and quiet modes.

Data goes to stdout; progress and notes go to stderr. The library itself never prints.
"""

from __future__ import annotations

import json
import sys
from functools import cached_property
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

PIPE_WIDTH = 10_000  # columns a table may take when stdout is not a terminal


class Output:
    """The consoles are made on first use: `--json` output writes with `json` and never imports rich."""

    def __init__(self, *, as_json: bool = False, quiet: bool = False) -> None:
        self.as_json = as_json
        self.quiet = quiet

    @cached_property
    def out(self) -> Console:
        """stdout. Piped or redirected output is read by scripts and grep: never cut a name to fit 80
        columns."""
        from rich.console import Console

        width = None if sys.stdout.isatty() else PIPE_WIDTH
        return Console(file=sys.stdout, highlight=False, soft_wrap=True, width=width)

    @cached_property
    def err(self) -> Console:
        """stderr: progress and notes."""
        from rich.console import Console

        return Console(file=sys.stderr, highlight=False, soft_wrap=True)

    @property
    def interactive(self) -> bool:
        """Progress bars only for a human at a terminal."""
        return not (self.as_json or self.quiet) and self.err.is_terminal

    def json(self, data: Any) -> None:
        sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")

    def print(self, *objects: Any) -> None:
        """Human-readable data on stdout (suppressed in json and quiet modes)."""
        if not (self.as_json or self.quiet):
            self.out.print(*objects)

    def note(self, message: str) -> None:
        """A remark for the human on stderr, printed as is (a path may hold `[...]`: no markup)."""
        if not (self.as_json or self.quiet):
            self.err.print(message, markup=False)


def layout_line(path: str) -> str:
    """`LeRobot layout (step 4, dp_world_size 1, batch_size 2)`, `torchtitan DCP layout`, ...: whose
    checkpoint a command read, for its report; empty when the path is no checkpoint (a Hub id)."""
    from ckpt_tools.catalog import catalog
    from ckpt_tools.errors import CheckpointError

    try:
        return catalog(path).layout_line()
    except (CheckpointError, OSError, ValueError):
        return ""
