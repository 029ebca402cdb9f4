"""Every file a docstring or comment of packages/*/src names exists, so a pointer left behind by a
move fails here instead of sending a reader to nothing.

A path (`engine/loop.py`, `docs/resume.md`, `tests/ckpt/test_x.py`) must exist relative to the module's
folder, its package, the package's `src/` or the repository; a bare file name (`loop.py`,
`resume.md`) must be the name of some module, test, benchmark or page of the repository.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SOURCES = sorted(REPO.glob("packages/*/src/*/**/*.py"))
PATH = re.compile(r"(?<![\w./:-])((?:[\w.-]+/)+[\w-]+\.(?:py|md))\b")
BARE = re.compile(r"(?<![\w./:-])([\w-]+\.(?:py|md))\b")
KNOWN_NAMES = {
    path.name
    for pattern in ("packages/**/*.py", "tests/**/*.py", "benchmarks/*.py", "*.py", "**/*.md")
    for path in REPO.glob(pattern)
    if ".nox" not in path.parts
}


def _comments_and_strings(source: Path) -> list[tuple[int, str]]:
    tokens = tokenize.generate_tokens(io.StringIO(source.read_text(encoding="utf-8")).readline)
    return [(t.start[0], t.string) for t in tokens if t.type in (tokenize.COMMENT, tokenize.STRING)]


def _dangling(source: Path) -> list[str]:
    src = next(parent for parent in source.parents if parent.name == "src")
    package = src / source.relative_to(src).parts[0]
    bases = (source.parent, package, src, REPO)
    found = []
    for line, text in _comments_and_strings(source):
        for ref in PATH.findall(text):
            if not any((base / ref).exists() for base in bases):
                found.append(f"{source.relative_to(REPO)}:{line}: {ref}")
        for name in BARE.findall(text):
            if name not in KNOWN_NAMES:
                found.append(f"{source.relative_to(REPO)}:{line}: {name}")
    return found


def test_the_sources_are_found() -> None:
    names = {path.name for path in SOURCES}
    assert {"catalog.py", "loop.py"} <= names and len(SOURCES) > 100


@pytest.mark.parametrize("package", ["ckpt-tools", "trainer"])
def test_every_file_a_source_names_exists(package: str) -> None:
    dangling = [
        line
        for source in SOURCES
        if f"packages/{package}/" in source.as_posix()
        for line in _dangling(source)
    ]
    assert not dangling, "docstrings or comments name files that do not exist:\n" + "\n".join(dangling)
