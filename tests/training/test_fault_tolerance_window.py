"""Gradient accumulation under fault tolerance, in one process (docs/fault_tolerance.md): a window the
replica groups do not commit is trained again, whole, on its micro-batches, after a new quorum.

A stand-in for the replica group (torchft's Manager needs a Lighthouse and peers: the processes of
tests/distributed/test_fault_tolerance_fsdp.py) refuses the first window's commit once, as a failed
exchange with a dead peer makes torchft's `should_commit` do.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ckpt_tools import layout
from helpers.train_flags import tiny_args
from trainer.cli.parse import parse_config
from trainer.distributed.fault_tolerance import Quorum, SingleGroup
from trainer.engine import startup
from trainer.engine.plan import train

ACCUMULATE = ("--accelerator.gradient_accumulation.steps=2", "--steps=4", "--save_freq=4")


class FirstCommitRefused(SingleGroup):
    """One replica group alone in its quorum, whose first commit the groups refuse."""

    may_retry = True

    def __init__(self) -> None:
        self.quorums: list[int] = []
        self.commits: list[int] = []

    def start_step(self, step: int) -> Quorum:
        self.quorums.append(step)
        return Quorum(step, 1, 0, changed=False, trained=False)

    def commit(self, step: int) -> bool:
        self.commits.append(step)
        return len(self.commits) > 1


def _train(out: Path, cache: str, *flags: str) -> dict[str, torch.Tensor]:
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    train(
        parse_config(
            tiny_args(str(out), cache, "--policy.type=mlp", "--policy.hidden_dim=16", *ACCUMULATE, *flags)
        )
    )
    step = out / "checkpoints" / "000004"
    model = load_file(step / layout.PRETRAINED_MODEL_DIR / layout.MODEL_SAFETENSORS)
    optimizer = load_file(step / layout.TRAINING_STATE_DIR / layout.OPTIMIZER_SAFETENSORS)
    scaler = step / layout.TRAINING_STATE_DIR / layout.SCALER_STATE  # fp16's loss scaler
    scale = json.loads(scaler.read_text()) if scaler.exists() else {}
    return {
        **{f"model.{k}": v for k, v in model.items()},
        **{f"optim.{k}": v for k, v in optimizer.items()},
        **{f"scaler.{k}": torch.tensor(v) for k, v in scale.items()},
    }


@pytest.mark.parametrize("precision", ["no", "fp16"])
def test_an_uncommitted_window_is_trained_again_whole(
    tmp_path: Path, dataset_cache: str, clean_accelerate, monkeypatch: pytest.MonkeyPatch, precision: str
) -> None:
    """Steps 1-2 are one window: its commit refused, a new quorum is taken at its first step and both
    micro-batches are trained again (not the last alone), so the weights and the optimizer state after
    4 steps equal, bit for bit, those of the same run whose every window was committed at once, and
    so does fp16's loss scaler (its scale and growth count). A quorum opens each window, not each
    micro-batch."""
    flags = () if precision == "no" else (f"--accelerator.mixed_precision={precision}",)
    committed = _train(tmp_path / "committed", dataset_cache, *flags)
    group = FirstCommitRefused()
    monkeypatch.setattr(startup, "join_replica_group", lambda *args: group)
    retried = _train(tmp_path / "retried", dataset_cache, *flags)
    assert (group.quorums, group.commits) == ([1, 1, 3], [2, 2, 4])
    assert retried.keys() == committed.keys()
    assert any(key.startswith("scaler.") for key in committed) == (precision == "fp16")
    for key, tensor in committed.items():
        assert torch.equal(retried[key], tensor), key
