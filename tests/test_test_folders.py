"""No folder of tests/ bears the import name of one of our packages.

pytest imports `tests/conftest.py` by putting `tests/` on `sys.path` (its default `prepend` import
mode, for a folder without `__init__.py`). A folder `tests/ckpt/` there is a namespace package
named `ckpt_tools`, and the path scan returns it before any import hook runs: with the package
installed through an editable hook (setuptools' strict mode, hatch's `dev-mode-exact`) or not
installed, `import ckpt_tools` in a test gave the test folder, and only `PYTHONPATH=packages/.../src`
hid it. So the test folders are named apart from the packages (`tests/ckpt/`, `tests/training/`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
IMPORT_NAMES = sorted(
    package.name
    for src in (REPO / "packages").glob("*/src")
    for package in src.iterdir()
    if (package / "__init__.py").is_file()
)


def test_the_packages_are_found() -> None:
    assert "ckpt_tools" in IMPORT_NAMES and "trainer" in IMPORT_NAMES


@pytest.mark.parametrize("name", IMPORT_NAMES)
def test_no_test_folder_shadows_a_package(name: str) -> None:
    assert not (REPO / "tests" / name).exists(), (
        f"tests/{name}/ is a namespace package `{name}` while tests/ is on sys.path: rename it"
    )
