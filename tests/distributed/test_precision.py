"""Mixed precision, the fp16 loss scaler and gradient clipping, observed inside real DDP 2 runs.

Two torchrun launches of the real CLI (scripts/train_observe_precision.py records, per rank, the
dtype a Linear layer computes in, the loss scale at each step and the gradient norm each update sees):
  bf16  autocast reaches the layers on every rank;
  fp16  the last rank alone meets an infinite loss at step 2: every rank must skip that update and
        halve the scale; with --optimizer.grad_clip_norm=0.01 (far below the gradient norms, ~1) every
        update sees a clipped gradient.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from ckpt_tools import layout
from helpers.launch import run_torchrun
from helpers.train_flags import tiny_args

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

SCRIPT = Path(__file__).parent / "scripts" / "train_observe_precision.py"
CLIP = 0.01
RUNS = {
    "bf16": ("0", "--accelerator.mixed_precision=bf16", "--steps=2"),
    "fp16": ("2", "--accelerator.mixed_precision=fp16", "--steps=4", f"--optimizer.grad_clip_norm={CLIP}"),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Per run: both ranks' records and the output directory."""
    root = tmp_path_factory.mktemp("precision")
    out = {}
    for name, (overflow_at, *extra) in RUNS.items():
        flags = tiny_args(str(root / name), str(root / "cache"), "--parallelism.dp_replicate=2", *extra)
        run_torchrun(SCRIPT, 2, str(root / name), overflow_at, *flags, timeout=180)
        ranks = [torch.load(f"{root / name}.rank{r}.pt") for r in range(2)]
        out[name] = {"ranks": ranks, "dir": root / name}
    return out


def test_bf16_autocast_reaches_the_layers_on_every_rank(runs) -> None:
    for record in runs["bf16"]["ranks"]:
        assert record["dtypes"] == ["torch.bfloat16"] * 2


def test_fp16_overflow_on_one_rank_is_skipped_on_every_rank_with_the_scale_halved(runs) -> None:
    for record in runs["fp16"]["ranks"]:
        assert record["dtypes"] == ["torch.float16"] * 4
        assert record["scales"] == [65536.0, 65536.0, 32768.0, 32768.0]  # halved by the step-2 overflow
        assert len(record["norms"]) == 3  # 4 steps, the overflowing one skipped
    scaler = json.loads(
        (
            runs["fp16"]["dir"] / "checkpoints" / "000004" / layout.TRAINING_STATE_DIR / layout.SCALER_STATE
        ).read_text()
    )
    assert (scaler["scale"], scaler["_growth_tracker"]) == (32768.0, 2)  # reset by the skip, then 2 updates


def test_clipping_engages_and_every_update_sees_the_clipped_norm(runs) -> None:
    metrics = (runs["fp16"]["dir"] / "metrics.jsonl").read_text().splitlines()
    logged = [r["grad_norm"] for r in map(json.loads, metrics) if math.isfinite(r.get("grad_norm", math.nan))]
    assert logged and min(logged) > 10 * CLIP  # the norm before clipping, as logged (nan at the overflow)
    for record in runs["fp16"]["ranks"]:
        assert record["norms"] == pytest.approx([CLIP] * 3, rel=1e-4)
