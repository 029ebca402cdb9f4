"""What `ckpt verify` collects while it checks: the checks that passed and the findings of those that
did not, each finding keyed by the file it is about.

Every check runs even after one fails, so two checks can find fault with one file (a truncated
`model.safetensors` is named by its header check and again by the manifest's size check). The key
lets a later check skip a file an earlier one already reported, by path: a message's text is never
searched for a file name, which a longer name containing it would match.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from ckpt_tools.errors import CheckpointError, Finding, one_line

T = TypeVar("T")


class Findings:
    """Collects problems instead of stopping at the first one."""

    def __init__(self) -> None:
        self.checked: list[str] = []
        self.found: list[Finding] = []

    @property
    def problems(self) -> tuple[str, ...]:
        """The report's lines, in the order the checks found them."""
        return tuple(finding.message for finding in self.found)

    def add(self, path: str | None, message: str) -> None:
        """One problem about `path`."""
        self.found.append(Finding(path, message))

    def reported(self, path: str | None) -> bool:
        """Whether an earlier check already found fault with `path` (never for None: about no file)."""
        return path is not None and any(finding.path == path for finding in self.found)

    def run(self, what: str | None, func: Callable[..., T], *args: Any, about: str) -> T | None:
        """Run one check of the file `about`; a CheckpointError becomes its finding, success records
        `what` (whatever the check returns, None included; a `what` of None records nothing: a read
        that a later check names as passed)."""
        try:
            result = func(*args)
        except CheckpointError as exc:
            self.add(about, one_line(exc, expected=(Exception,)))
            return None
        if what is not None:
            self.checked.append(what)
        return result

    def extend(self, what: str | None, findings: Iterable[Finding]) -> None:
        """The findings of one check; none records `what` as passed (a `what` of None, nothing)."""
        found = list(findings)
        self.found.extend(found)
        if not found and what is not None:
            self.checked.append(what)

    def extend_about(self, what: str | None, path: str | None, problems: Iterable[str]) -> None:
        """`extend` for a check whose every line is about `path`."""
        self.extend(what, (Finding(path, problem) for problem in problems))
