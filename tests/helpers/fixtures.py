"""Where the artifacts written by third-party tools live: `<repo>/../shared/fixtures`.

CI clones the repository with `shared/` beside it; a git worktree one level deeper finds it one level up.
`SHARED_FIXTURES` overrides both. A missing fixture fails the test (it is never skipped).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def fixture_dir(*parts: str) -> Path:
    """The shared fixture at `parts` (never modify it: copy it with `copy_fixture`)."""
    roots = [
        os.environ.get("SHARED_FIXTURES"),
        REPO.parent / "shared" / "fixtures",
        REPO.parent.parent / "shared" / "fixtures",
    ]
    for root in roots:
        if root and (Path(root).joinpath(*parts)).exists():
            return Path(root).joinpath(*parts)
    pytest.fail(f"shared fixture {'/'.join(parts)} not found beside the repository (set SHARED_FIXTURES)")


def copy_fixture(tmp_path: Path, *parts: str) -> Path:
    """A private copy of a shared fixture under `tmp_path`."""
    target = tmp_path / parts[-1]
    shutil.copytree(fixture_dir(*parts), target, symlinks=True)
    return target
