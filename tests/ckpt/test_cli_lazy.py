"""Commands are imported when they run: `ckpt inspect` does not import conversion, publishing or diff,
and on a local path `--json` imports neither fsspec nor rich (the start time that buys is measured by
benchmarks/bench_cli.py)."""

from __future__ import annotations

import subprocess
import sys

from helpers.fixtures import fixture_dir

_PROBE = """
import sys
sys.argv = ["ckpt", *sys.argv[1:]]
from ckpt_tools.cli.app import main
try:
    main()
except SystemExit:
    pass
outside = ("torch", "huggingface_hub", "fsspec", "rich")
print(" ".join(sorted(m for m in sys.modules if m.startswith("ckpt_tools.") or m in outside)), file=sys.stderr)
"""


def _imported(*args: str) -> set[str]:
    done = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, timeout=120)
    return set(done.stderr.split())


def test_inspect_imports_only_what_it_needs() -> None:
    step = fixture_dir("lerobot", "checkpoint_act", "checkpoints", "000004")
    modules = _imported("inspect", "--json", str(step))
    assert "ckpt_tools.cli.inspect_command" in modules
    for heavy in (
        "ckpt_tools.cli.convert",
        "ckpt_tools.cli.push",
        "ckpt_tools.cli.diff",
        "ckpt_tools.tools.publish",
    ):
        assert heavy not in modules, heavy
    assert "torch" not in modules and "huggingface_hub" not in modules


def test_local_json_inspect_imports_no_fsspec_and_no_rich() -> None:
    """fsspec is a quarter of the command's time and rich the tables' cost: a local `--json` read
    needs neither (storage answers plain paths with os; the tables are drawn only when printed)."""
    step = fixture_dir("lerobot", "checkpoint_act", "checkpoints", "000004")
    modules = _imported("inspect", "--json", str(step))
    assert "ckpt_tools.files.storage" in modules  # the probe ran the command
    assert "fsspec" not in modules and "rich" not in modules, modules & {"fsspec", "rich"}
    assert "rich" in _imported("inspect", str(step))  # the tables still print


def test_help_and_version_still_answer() -> None:
    assert "ckpt_tools.cli.convert" in _imported("--help")  # --help lists every command
    assert "ckpt_tools.cli.inspect_command" not in _imported("--version")
