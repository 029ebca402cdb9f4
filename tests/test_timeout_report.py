"""A pytest-timeout time-out inside a fixture names the fixture and the time it had (tests/conftest.py),
so a module fixture that trains and runs out of time on a busy machine reads as a time-out, not as a
defect of the tests that share it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

CONFTEST = Path(__file__).with_name("conftest.py")

SLOW_MODULE = """
import time

import pytest


@pytest.fixture(scope="module")
def trained():
    time.sleep(30)


@pytest.mark.timeout(2)
def test_first(trained):
    pass


@pytest.mark.timeout(2)
def test_second(trained):
    pass


@pytest.mark.timeout(2)
def test_without_the_fixture_fails_plainly():
    time.sleep(30)
"""


def test_a_timeout_in_a_module_fixture_names_the_fixture_and_its_time(tmp_path: Path) -> None:
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "test_slow.py").write_text(SLOW_MODULE)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", f"--rootdir={tmp_path}", "."],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "400"},
    )  # fmt: skip
    out = result.stdout
    assert result.returncode == 1, out
    assert "1 failed, 2 errors" in out, out
    named = "Timeout in fixture 'trained' (module scope, test_slow.py:7): it had been setting up for 2 s"
    assert named in out, out
    assert "pytest-timeout's 2.0 s for test_slow.py::test_first ran out" in out, out
    assert "not a failed check" in out
    # the module's other test errors with the same named cause (pytest keeps the fixture's failure)
    assert "ERROR test_slow.py::test_second - Failed: Timeout in fixture 'trained'" in out, out
    assert out.count("for test_slow.py::test_first ran out") == 4, out  # both tests: report and summary
    # a time-out in a test's own body is pytest-timeout's plain message, not a fixture's
    assert "E       Failed: Timeout (>2.0s) from pytest-timeout." in out, out
    assert "FAILED test_slow.py::test_without_the_fixture_fails_plainly - Failed: Timeout (>2.0s)" in out, out
