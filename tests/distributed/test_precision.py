"""Mixed precision, the fp16 loss scaler and gradient clipping, observed inside real 2-rank runs.

torchrun launches of the real CLI (scripts/train_observe_precision.py records, per rank, the dtype a
Linear layer computes in, the loss scale and the sum of the rank's weights at each step, and the
gradient norm each update sees):
  bf16        DDP: autocast reaches the layers on every rank;
  fp16        DDP: the last rank alone meets an infinite loss at step 2: every rank must skip that
              update and halve the scale; with --optimizer.grad_clip_norm=0.01 (far below the gradient
              norms, ~1) every update sees a clipped gradient;
  fp16_fsdp   FSDP2: after the gradients are reduced, one element of the last rank's own gradient shard
              becomes inf at step 3, which no other rank's shard sees: every rank must still skip that
              update (torch's DTensor dispatch reduces the scaler's found-inf flag over the shards) and
              halve the scale. fp16_fsdp_resumed resumes its step-2 checkpoint with the same overflow
              at step 3 and must end bit-identical to it, loss scale included.
"""

from __future__ import annotations

import json
import math
from itertools import pairwise
from pathlib import Path

import pytest
import torch

from ckpt_tools import layout
from helpers.launch import run_torchrun
from helpers.run_outputs import metrics
from helpers.stored_state import assert_bit_identical
from helpers.train_flags import tiny_args

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

SCRIPT = Path(__file__).parent / "scripts" / "train_observe_precision.py"
CLIP = 0.01
DDP = "--parallelism.dp_replicate=2"
FSDP = ("--parallelism.dp_shard=2", "--policy.type=mlp", "--accelerator.mixed_precision=fp16")
RUNS = {
    "bf16": ("0", DDP, "--accelerator.mixed_precision=bf16", "--steps=2"),
    "fp16": (
        "2",
        DDP,
        "--accelerator.mixed_precision=fp16",
        "--steps=4",
        "--use_policy_training_preset=false",
        f"--optimizer.grad_clip_norm={CLIP}",
        "--seed=2",  # an initial draw whose first step does not overflow at 65536 of its own accord
    ),
    "fp16_fsdp": ("3:shard", *FSDP),
}


def _launch(root: Path, name: str, overflow: str, *flags: str) -> dict:
    run_torchrun(SCRIPT, 2, str(root / name), overflow, *flags, timeout=180)
    return {"ranks": [torch.load(f"{root / name}.rank{r}.pt") for r in range(2)], "dir": root / name}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Per run: both ranks' records and the output directory."""
    root = tmp_path_factory.mktemp("precision")
    out = {}
    for name, (overflow, *extra) in RUNS.items():
        out[name] = _launch(root, name, overflow, *tiny_args(str(root / name), str(root / "cache"), *extra))
    config = (
        out["fp16_fsdp"]["dir"] / "checkpoints" / "000002" / layout.PRETRAINED_MODEL_DIR / layout.TRAIN_CONFIG
    )
    resumed = root / "fp16_fsdp_resumed"
    flags = ("--resume=true", f"--config_path={config}", f"--output_dir={resumed}")
    out["fp16_fsdp_resumed"] = _launch(root, "fp16_fsdp_resumed", "1:shard", *flags)  # its step 1 is step 3
    return out


def _scaler_state(run: dict, step: int) -> dict:
    path = run["dir"] / "checkpoints" / f"{step:06d}" / layout.TRAINING_STATE_DIR / layout.SCALER_STATE
    return json.loads(path.read_text())


def test_bf16_autocast_reaches_the_layers_on_every_rank(runs) -> None:
    for record in runs["bf16"]["ranks"]:
        assert record["dtypes"] == ["torch.bfloat16"] * 2


def test_fp16_overflow_on_one_rank_is_skipped_on_every_rank_with_the_scale_halved(runs) -> None:
    for record in runs["fp16"]["ranks"]:
        assert record["dtypes"] == ["torch.float16"] * 4
        assert record["scales"] == [65536.0, 65536.0, 32768.0, 32768.0]  # halved by the step-2 overflow
        assert len(record["norms"]) == 3  # 4 steps, the overflowing one skipped
        weights = record["weights"]
        assert weights[0] != weights[1] and weights[1] == weights[2] != weights[3]  # step 2 changed nothing
    scaler = _scaler_state(runs["fp16"], 4)
    assert (scaler["scale"], scaler["_growth_tracker"]) == (32768.0, 2)  # reset by the skip, then 2 updates


def test_clipping_engages_and_every_update_sees_the_clipped_norm(runs) -> None:
    records = metrics(runs["fp16"]["dir"])
    logged = [r["grad_norm"] for r in records if math.isfinite(r.get("grad_norm", math.nan))]
    assert logged and min(logged) > 10 * CLIP  # the norm before clipping, as logged (nan at the overflow)
    for record in runs["fp16"]["ranks"]:
        assert record["norms"] == pytest.approx([CLIP] * 3, rel=1e-4)


def _updated(record: dict) -> list[bool]:
    """Whether the update after each recorded step (but the last) changed this rank's weights."""
    return [before != after for before, after in pairwise(record["weights"])]


def test_fp16_fsdp2_overflow_in_one_rank_shard_is_skipped_on_every_rank(runs) -> None:
    """The gradients of an fp16 FSDP2 run are float16 before they are reduced, so at the initial scale
    (65536) the first update overflows on its own; step 3's overflow sits in the last rank's shard only."""
    first, last = runs["fp16_fsdp"]["ranks"]
    for record in (first, last):
        assert record["dtypes"] == ["torch.float16"] * 4
        assert _updated(record)[1:] == [True, False]  # step 2 updated, step 3 skipped on this rank too
        assert record["scales"][2:] == [32768.0, 16384.0]  # halved by the step-3 overflow
        for updated, (scale, following) in zip(_updated(record), pairwise(record["scales"]), strict=True):
            assert following == (scale if updated else scale / 2)
    assert first["scales"] == last["scales"] and _updated(first) == _updated(last)
    scaler = _scaler_state(runs["fp16_fsdp"], 4)
    assert (scaler["scale"], scaler["_growth_tracker"]) == (16384.0, 1)  # reset by the skip, then step 4


def test_fp16_fsdp2_resume_restores_the_loss_scale_bit_exact(runs) -> None:
    straight, resumed = runs["fp16_fsdp"], runs["fp16_fsdp_resumed"]
    for before, after in zip(straight["ranks"], resumed["ranks"], strict=True):
        assert after["scales"] == before["scales"][2:]  # 32768 at step 3: the saved scale, not 65536
        assert after["weights"] == before["weights"][2:]
    assert _scaler_state(resumed, 4) == _scaler_state(straight, 4)
    assert_bit_identical(
        resumed["dir"] / "checkpoints" / "000004", straight["dir"] / "checkpoints" / "000004"
    )
