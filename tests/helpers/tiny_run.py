"""A tiny single-process training run for checkpoint tests: model, AdamW, scheduler, a save call."""

from __future__ import annotations

import torch
from torch import nn

import ckpt_tools
from ckpt_tools.format.meta import Topology, TrainingStep


def tiny_model() -> nn.Module:
    """An odd-sized hidden layer and an integer buffer, so dtype handling and shapes are exercised."""
    model = nn.Sequential(nn.Linear(4, 7), nn.ReLU(), nn.Linear(7, 3))
    model.register_buffer("calls", torch.tensor([3, 1], dtype=torch.int64))
    return model


def training_step(step: int, checkpoint_format: str = "safetensors") -> TrainingStep:
    return TrainingStep(
        step=step,
        dp_world_size=1,
        batch_size=2,
        grad_accum_steps=1,
        mixed_precision="no",
        topology=Topology(),
        checkpoint_format=checkpoint_format,
    )


def make_run(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    torch.manual_seed(seed)
    model = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.8, 0.95), weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.9**s)
    return model, optimizer, scheduler


def train(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler, steps: int) -> None:
    generator = torch.Generator().manual_seed(123)
    for _ in range(steps):
        model(torch.randn(2, 4, generator=generator)).square().mean().backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()


def assert_same_optimizer_state(a: dict, b: dict) -> None:
    """Exact equality of two `optimizer.state_dict()`s: tensors bit for bit, every other value with ==
    and the same type (a tuple stays a tuple)."""
    assert a["param_groups"] == b["param_groups"]
    for group_a, group_b in zip(a["param_groups"], b["param_groups"], strict=True):
        assert {k: type(v) for k, v in group_a.items()} == {k: type(v) for k, v in group_b.items()}
    assert a["state"].keys() == b["state"].keys()
    for pid, entry in a["state"].items():
        assert entry.keys() == b["state"][pid].keys()
        for key, value in entry.items():
            assert value.dtype == b["state"][pid][key].dtype
            assert torch.equal(value, b["state"][pid][key]), (pid, key)


def save(root, step: int, model, optimizer, scheduler, **kwargs) -> str:
    return ckpt_tools.training.save_checkpoint(
        ckpt_tools.training.SaveRequest(
            checkpoints_dir=root,
            training_step=kwargs.pop("ts", training_step(step)),
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            policy_config={"type": "mlp", "hidden": 7},
            train_config={"steps": 10, "seed": 0},
            **kwargs,
        )
    )


def assert_same_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    """Same keys, and every tensor equal bit for bit with the same dtype."""
    assert a.keys() == b.keys()
    for key, tensor in a.items():
        assert tensor.dtype == b[key].dtype and torch.equal(tensor, b[key]), key
