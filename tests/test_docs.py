"""The pages in docs/ stand on their own: they cite no file outside the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).parents[1] / "docs"


@pytest.mark.parametrize("page", sorted(DOCS.glob("*.md")), ids=lambda p: p.name)
def test_docs_cite_nothing_outside_the_repository(page: Path) -> None:
    text = page.read_text()
    outside = re.findall(r"DESIGN\.md|STYLE\.md|HUB-FACTS\.md|\.\./shared|shared folder", text)
    assert not outside, f"{page.name} cites {outside}: say it in docs/ instead"
