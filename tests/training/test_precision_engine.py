"""Mixed precision, the fp16 loss scaler and clipping observed inside one-process runs (no launch).

The observer is the one the DDP tests launch (tests/distributed/scripts/train_observe_precision.py):
it records the dtype a Linear computes in, the loss scale at each step and the gradient norm each
update sees, and can make the loss of one step infinite.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

import trainer.engine.plan
import trainer.engine.startup
from ckpt_tools import layout
from helpers.run_outputs import metrics
from helpers.train_flags import tiny_args
from trainer.cli.parse import parse_config
from trainer.distributed.factory import prepare

SCRIPT = Path(__file__).parents[1] / "distributed" / "scripts" / "train_observe_precision.py"
CLIP = 0.01


def _watched_run(
    out: Path, cache: str, monkeypatch: pytest.MonkeyPatch, overflow_at: int, *flags: str
) -> dict:
    spec = importlib.util.spec_from_file_location("train_observe_precision", SCRIPT)
    assert spec is not None and spec.loader is not None
    observer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(observer)
    records: list[dict] = []

    def watched(accelerator: Any, policy: Any, optimizer: Any, scheduler: Any, wrap_plan: Any) -> tuple:
        model, optimizer, scheduler = prepare(accelerator, policy, optimizer, scheduler, wrap_plan)
        records.append(observer.watch(accelerator, model, optimizer, overflow_at))
        return model, optimizer, scheduler

    monkeypatch.setattr(trainer.engine.startup, "prepare", watched)
    trainer.engine.plan.train(parse_config(tiny_args(str(out), cache, "--policy.type=mlp", *flags)))
    return records[0]


def test_bf16_autocast_reaches_the_layers(tmp_path, dataset_cache, clean_accelerate, monkeypatch) -> None:
    record = _watched_run(
        tmp_path, dataset_cache, monkeypatch, 0, "--accelerator.mixed_precision=bf16", "--steps=2"
    )
    assert record["dtypes"] == ["torch.bfloat16"] * 2


def test_fp16_overflow_is_skipped_with_the_scale_halved_and_clipping_engages(
    tmp_path, dataset_cache, clean_accelerate, monkeypatch
) -> None:
    flags = ("--accelerator.mixed_precision=fp16", "--steps=4", "--use_policy_training_preset=false")
    flags += (f"--optimizer.grad_clip_norm={CLIP}",)
    record = _watched_run(tmp_path, dataset_cache, monkeypatch, 2, *flags)
    assert record["dtypes"] == ["torch.float16"] * 4
    assert record["scales"] == [65536.0, 65536.0, 32768.0, 32768.0]
    weights = record["weights"]
    assert weights[0] != weights[1] and weights[1] == weights[2] != weights[3]  # step 2 changed nothing
    assert record["norms"] == pytest.approx([CLIP] * 3, rel=1e-4)  # 3 updates, each clipped
    scaler_file = tmp_path / "checkpoints" / "000004" / layout.TRAINING_STATE_DIR / layout.SCALER_STATE
    scaler = json.loads(scaler_file.read_text())
    assert (scaler["scale"], scaler["_growth_tracker"]) == (32768.0, 2)
    logged = metrics(tmp_path)
    trained = [r for r in logged if r.get("event") == "train"]
    assert next(r["grad_norm"] for r in trained if r["step"] == 4) > 10 * CLIP  # before clipping
