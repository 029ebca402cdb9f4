"""A save before the optimizer's first update leaves training as it was (an fp16 run whose first steps
the loss scaler skips and a SIGTERM at step 1 both save then).

torch's optimizer state-dict helper creates the state of an optimizer that has not stepped by running a
step at learning rate 0; for AdamW that counts as its first step, and the first real update then comes
out about a quarter smaller (bias correction for step 2 instead of 1). A save of a never-stepped
optimizer therefore leaves it without state and writes none, so the run that saved, the run that did
not and the run resumed from that save take the same first update, bit for bit. Both optimizer forms
are covered: `optimizer_state.safetensors` (a plain model) and `optimizer_0/` (a sharded one)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

import ckpt_tools
from ckpt_tools import layout
from helpers.tiny_run import make_run, save, train, training_step


def _run(sharded: bool) -> tuple[torch.nn.Module, torch.optim.Optimizer, object]:
    model, optimizer, scheduler = make_run(seed=4)
    if sharded:
        fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.8, 0.95), weight_decay=0.1)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.9**s)
    return model, optimizer, scheduler


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {
        name: (value.full_tensor() if isinstance(value, DTensor) else value).clone()
        for name, value in model.state_dict().items()
    }


@pytest.mark.parametrize("sharded", [False, True], ids=["optimizer_state.safetensors", "optimizer_0"])
def test_a_save_before_the_first_update_changes_no_update(one_rank, tmp_path: Path, sharded: bool) -> None:
    saved_model, saved_optimizer, saved_scheduler = _run(sharded)
    step = Path(save(tmp_path / "checkpoints", 0, saved_model, saved_optimizer, saved_scheduler))
    assert not saved_optimizer.state  # no state created by the save
    state_dir = step / layout.TRAINING_STATE_DIR
    assert (state_dir / (layout.OPTIMIZER_DCP_DIR if sharded else layout.OPTIMIZER_SAFETENSORS)).exists()

    never_saved = _run(sharded)
    resumed_model, resumed_optimizer, resumed_scheduler = _run(sharded)
    ckpt_tools.training.load_training_state(
        step, model=resumed_model, optimizer=resumed_optimizer, scheduler=resumed_scheduler
    )
    assert not resumed_optimizer.state
    assert resumed_optimizer.param_groups[0]["betas"] == (0.8, 0.95)

    runs = [(saved_model, saved_optimizer, saved_scheduler), never_saved]
    runs.append((resumed_model, resumed_optimizer, resumed_scheduler))
    for model, optimizer, scheduler in runs:
        train(model, optimizer, scheduler, 2)
    want = _weights(never_saved[0])
    for model, optimizer, _ in runs:
        assert all(float(entry["step"]) == 2 for entry in optimizer.state.values())
        got = _weights(model)
        for name, tensor in want.items():
            assert torch.equal(got[name], tensor), name


def test_a_plain_save_before_the_first_update_resumes_into_shards(one_rank, tmp_path: Path) -> None:
    """A DDP-style checkpoint saved before any update, resumed as FSDP2: no state either."""
    model, optimizer, scheduler = _run(sharded=False)
    step = save(tmp_path / "checkpoints", 0, model, optimizer, scheduler, ts=training_step(0))
    sharded_model, sharded_optimizer, _ = _run(sharded=True)
    ckpt_tools.training.load_training_state(step, model=sharded_model, optimizer=sharded_optimizer)
    assert not sharded_optimizer.state
