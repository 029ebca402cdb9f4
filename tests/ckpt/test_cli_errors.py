"""The bad-input battery: every broken input gives one `error: ...` line on stderr and exit 1, never a
traceback; `ckpt verify` lists the same damage as problems. A `.metadata` pickle that would create a
file if executed is refused by name and the file never appears."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from report_fixtures import run_ckpt, tiny_model_state, write_step_dir
from safetensors.torch import save_file

from ckpt_tools import layout


class _RunsShell:
    """Unpickling this with the standard unpickler would run `touch <path>`."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (f"touch {self.path}",))


class _OpensFile:
    """Unpickling this with the standard unpickler would create `<path>` through builtins.open."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (open, (str(self.path), "w"))


def _step(tmp_path: Path, fmt: str = "dcp") -> Path:
    return write_step_dir(tmp_path, fmt, dp_shard=2 if fmt != "safetensors" else 1)


def _training_step_file(step_dir: Path) -> Path:
    return step_dir / layout.TRAINING_STATE_DIR / layout.TRAINING_STEP


def missing_path(tmp_path: Path) -> Path:
    return tmp_path / "no-such-checkpoint"


def not_a_checkpoint(tmp_path: Path) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "notes.txt").write_text("hello")
    return tmp_path


def truncated_shard(tmp_path: Path) -> Path:
    step_dir = _step(tmp_path, "safetensors")
    shard = step_dir / layout.PRETRAINED_MODEL_DIR / layout.MODEL_SAFETENSORS
    shard.write_bytes(shard.read_bytes()[:-9])
    return step_dir


def truncated_distcp(tmp_path: Path) -> Path:
    step_dir = _step(tmp_path)
    shard = step_dir / layout.PRETRAINED_MODEL_DIR / layout.MODEL_DCP_DIR / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:50])
    return step_dir


def bad_json(tmp_path: Path) -> Path:
    step_dir = _step(tmp_path)
    _training_step_file(step_dir).write_text('{"step": 5,')
    return step_dir


def _edit_training_step(tmp_path: Path, edit: Callable[[dict], None]) -> Path:
    step_dir = _step(tmp_path)
    data = json.loads(_training_step_file(step_dir).read_text())
    edit(data)
    _training_step_file(step_dir).write_text(json.dumps(data))
    return step_dir


def unknown_version(tmp_path: Path) -> Path:
    return _edit_training_step(tmp_path, lambda d: d.update(format_version=7))


def legacy(tmp_path: Path) -> Path:
    return _edit_training_step(tmp_path, lambda d: d.pop("format_version"))


def mistyped_field(tmp_path: Path) -> Path:
    return _edit_training_step(tmp_path, lambda d: d.update(batch_size="8"))


def _malicious_metadata(tmp_path: Path, payload: object) -> Path:
    step_dir = _step(tmp_path)
    metadata = step_dir / layout.PRETRAINED_MODEL_DIR / layout.MODEL_DCP_DIR / layout.DCP_METADATA
    metadata.write_bytes(pickle.dumps({"state_dict_metadata": payload}))
    return step_dir


CASES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "missing path": (missing_path, "no such file or directory"),
    "not a checkpoint": (not_a_checkpoint, "holds no model weights"),
    "truncated shard": (truncated_shard, "truncated"),
    "truncated distcp": (truncated_distcp, "__0_0.distcp is truncated"),
    "bad json": (bad_json, "is not valid JSON"),
    "unknown version": (unknown_version, "format_version 7 is newer"),
    "legacy": (legacy, "weights still load"),
    "mistyped field": (mistyped_field, "field 'batch_size' should be int"),
}
VERIFY_RAISES = {"missing path", "not a checkpoint"}  # nothing to verify: an error, not a report


def assert_one_line_error(result, fragment: str) -> str:  # type: ignore[no-untyped-def]
    assert result.exit_code == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert fragment in lines[0], lines[0]
    assert "Traceback" not in result.stdout + result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit)
    return lines[0]


@pytest.mark.parametrize("case", sorted(CASES))
def test_inspect_fails_with_one_line(tmp_path: Path, case: str) -> None:
    build, fragment = CASES[case]
    result = run_ckpt("inspect", build(tmp_path))
    assert_one_line_error(result, fragment)
    assert result.stdout == ""


@pytest.mark.parametrize("case", sorted(CASES))
def test_diff_fails_with_one_line(tmp_path: Path, case: str) -> None:
    build, fragment = CASES[case]
    good = tmp_path / "good.safetensors"
    save_file(tiny_model_state(), str(good))
    broken = build(tmp_path / "broken")
    assert_one_line_error(run_ckpt("diff", good, broken), fragment)
    assert_json_error(run_ckpt("diff", broken, good, "--json"), fragment)


def assert_json_error(result, fragment: str, exit_code: int = 1) -> str:  # type: ignore[no-untyped-def]
    """--json mode: the error is a JSON document on stdout, with the exit code of the text mode."""
    assert result.exit_code == exit_code, (result.stdout, result.stderr)
    assert result.stderr == ""
    error = json.loads(result.stdout)["error"]
    assert fragment in error and "\n" not in error
    return error


@pytest.mark.parametrize("command", ["inspect", "verify", "convert", "push", "merge-adapter"])
def test_json_mode_errors_are_json(tmp_path: Path, command: str) -> None:
    args = {
        "push": [tmp_path / "missing", "user/repo"],
        "merge-adapter": [tmp_path / "missing", "-o", tmp_path],
    }
    result = run_ckpt(command, *args.get(command, [tmp_path / "missing"]), "--json")
    assert_json_error(result, "missing")


def test_json_mode_bad_option_value_is_json_with_exit_2(tmp_path: Path) -> None:
    step_dir = write_step_dir(tmp_path, "safetensors")
    assert_json_error(run_ckpt("convert", step_dir, "--to", "zip", "--json"), "--to 'zip'", exit_code=2)
    assert run_ckpt("convert", step_dir, "--to", "zip").exit_code == 2  # typer's usage box, as before


@pytest.mark.parametrize("case", sorted(CASES))
def test_verify_reports_the_damage(tmp_path: Path, case: str) -> None:
    build, fragment = CASES[case]
    result = run_ckpt("verify", build(tmp_path))
    if case in VERIFY_RAISES:
        assert_one_line_error(result, fragment)
        return
    assert result.exit_code == 1 and result.stderr == ""
    assert "FAILED" in result.stdout and fragment in " ".join(result.stdout.split())
    assert "Traceback" not in result.stdout


@pytest.mark.parametrize(
    ("payload_class", "refused"), [(_RunsShell, "posix.system"), (_OpensFile, "io.open")]
)
@pytest.mark.parametrize("command", ["inspect", "verify", "diff"])
def test_malicious_metadata_is_refused_not_run(
    tmp_path: Path, command: str, payload_class: type, refused: str
) -> None:
    target = tmp_path / "created-by-pickle"
    step_dir = _malicious_metadata(tmp_path / "ckpt", payload_class(target))
    args = [step_dir, step_dir] if command == "diff" else [step_dir]
    result = run_ckpt(command, *args)
    assert result.exit_code == 1
    assert not target.exists()
    if command == "verify":
        assert f"asks for {refused}" in result.stdout and "refused" in result.stdout
    else:
        line = assert_one_line_error(result, f"asks for {refused}")
        assert "refused without executing it" in line


def _ckpt_subprocess(*args: object) -> subprocess.CompletedProcess[str]:
    """The installed entry point's code path in a fresh interpreter, as a user runs it."""
    code = "import sys; from ckpt_tools.cli.app import main; sys.argv = ['ckpt', *sys.argv[1:]]; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "CKPT_DEBUG"},
    )


def test_subprocess_missing_path_and_refused_pickle(tmp_path: Path) -> None:
    result = _ckpt_subprocess("inspect", tmp_path / "missing")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip().startswith("error: ") and len(result.stderr.strip().splitlines()) == 1

    target = tmp_path / "created-by-pickle"
    step_dir = _malicious_metadata(tmp_path / "ckpt", _RunsShell(target))
    result = _ckpt_subprocess("inspect", step_dir, "--json")
    assert result.returncode == 1 and result.stderr == ""
    assert "posix.system" in json.loads(result.stdout)["error"] and "Traceback" not in result.stdout
    assert not target.exists()


def test_subprocess_verify_lists_problems_without_traceback(tmp_path: Path) -> None:
    result = _ckpt_subprocess("verify", truncated_shard(tmp_path))
    assert result.returncode == 1 and "Traceback" not in result.stdout + result.stderr
    assert "truncated" in result.stdout
