"""A collective save that fails for real, not through an injected error: the disk fills up (a
file-size limit on the whole launch stands in for it) while the main rank writes the gathered
`model.safetensors`. Every rank ends with at most one `error:` line and no traceback of ours, `last`
stays on the previous step; with CKPT_DEBUG=1 the traceback is kept for developers."""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.launch import launch_env, no_traceback_from_us, torchrun_command
from helpers.train_flags import tiny_args

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]

SCRIPT = Path(__file__).parent / "scripts" / "train_cli.py"
# hidden_dim 256: model.safetensors and the optimizer state are a few hundred KB, everything the run
# writes before its first save (dataset cache, metrics, configs) stays far below the limit.
FILE_LIMIT = 128 << 10


def _full_disk() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))


def _run(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=240,
        preexec_fn=_full_disk,
    )


def _args(out: Path, cache: Path) -> list[str]:
    return tiny_args(str(out), str(cache), "--policy.type=mlp", "--policy.hidden_dim=256", "--steps=2")


def test_full_disk_in_a_two_rank_save_is_one_line_per_rank(tmp_path: Path) -> None:
    out = tmp_path / "run"
    env = {k: v for k, v in launch_env().items() if k != "CKPT_DEBUG"}
    result = _run(torchrun_command(SCRIPT, 2, *_args(out, tmp_path / "cache")), env)
    errors = [line for line in result.stdout.splitlines() if line.startswith("error: ")]
    assert result.returncode != 0, result.stdout[-3000:]
    assert 1 <= len(errors) <= 2 and len(set(errors)) == 1, result.stdout[-3000:]
    assert "File too large" in errors[0] and "failed on the main rank" in errors[0], errors[0]
    assert no_traceback_from_us(result.stdout), result.stdout[-3000:]
    assert not (out / "checkpoints" / "last").exists()


def test_ckpt_debug_keeps_the_traceback(tmp_path: Path) -> None:
    out = tmp_path / "run"
    env = {**launch_env(), "CKPT_DEBUG": "1"}
    result = _run([sys.executable, str(SCRIPT), *_args(out, tmp_path / "cache")], env)
    assert result.returncode != 0
    assert "Traceback" in result.stdout and "File too large" in result.stdout, result.stdout[-3000:]
    assert "/ckpt_tools/" in result.stdout  # the frames of the failing write
