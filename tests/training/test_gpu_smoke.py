"""The GPU smoke lane (benchmarks/gpu_smoke.py) where there is no GPU: it says so in one line and exits
0, and its `--device cpu` dry run passes every check of the lane (bf16 training, the bit-exact resume,
synchronous and background DCP saves, conversion, load_policy, the large act_state, pi0.5 and FastWAM
built on meta) at toy sizes."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import torch

from helpers.run_outputs import model_file

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "gpu_smoke.py"


def test_without_cuda_it_says_so_in_one_line_and_exits_0() -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU, on a GPU machine too
    result = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120, env=env
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"gpu_smoke: no CUDA device here (torch {torch.__version__}): nothing to check; run it on a GPU machine"
    ]


def test_the_cpu_dry_run_passes_every_check(tmp_path, clean_accelerate, capsys, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # its sibling memory_worker, as when run as a script
    spec = importlib.util.spec_from_file_location("gpu_smoke", SCRIPT)
    assert spec is not None and spec.loader is not None
    smoke = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(smoke)
    assert smoke.main(["--device", "cpu", "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "gpu_smoke on cpu (dry run: figures mean nothing): all checks passed" in out
    for line in (
        "| train step (bf16",
        "| save stall: raw dcp.save |",
        "| save stall: ckpt_tools background save",
        "| large policy built on meta (",
        "| pi0.5 built on meta (the fixture's tiny sizes, expert-only, bfloat16) |",
        "| FastWAM built on meta (the fixture's tiny sizes, freeze_video_expert, lambda_video=0, bfloat16) |",
    ):
        assert line in out
    assert model_file(tmp_path / "dcp", 2).is_file()
    for run in ("large", "pi05", "fastwam"):
        assert model_file(tmp_path / run, 1).is_file()
