"""Where the artifacts written by third-party tools live: `tests/fixtures/` in this repository.

They are committed byte for byte as those tools wrote them (tests/fixtures/README.md says which tool and
version wrote each one), so the suite needs nothing beside the clone. A missing fixture fails the test
(it is never skipped).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"


def fixture_dir(*parts: str) -> Path:
    """The committed fixture at `parts` (never modify it: copy it with `copy_fixture`)."""
    path = FIXTURES.joinpath(*parts)
    if not path.exists():
        pytest.fail(f"fixture tests/fixtures/{'/'.join(parts)} is missing from the checkout")
    return path


def copy_fixture(tmp_path: Path, *parts: str) -> Path:
    """A private copy of a committed fixture under `tmp_path`."""
    target = tmp_path / parts[-1]
    shutil.copytree(fixture_dir(*parts), target, symlinks=True)
    return target
