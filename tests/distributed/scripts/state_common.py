"""Shared pieces of the multi-process checkpoint scripts: a tiny model with uneven shards, the
parallel wrappers, a deterministic training step, and the reference dump the tests compare against."""

from __future__ import annotations

import os

import clean_exit
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel

from ckpt_tools.format.meta import Topology, TrainingStep

FULL_ON_RANK0 = StateDictOptions(full_state_dict=True, cpu_offload=True)


class Tiny(nn.Module):
    """9 and 5 rows split over 2 or 4 ranks give uneven shards (and an empty one on 4 ranks)."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(6, 9)
        self.head = nn.Linear(9, 5)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.encoder(x))) * self.scale


def build(kind: str, seed: int = 0, bf16: bool = False) -> tuple[nn.Module, torch.optim.Optimizer]:
    """kind: `fsdp` (1-D mesh over all ranks), `hsdp` (2 x world/2 mesh) or `ddp`; `bf16` computes in
    bfloat16 through FSDP2's MixedPrecisionPolicy (the sharded parameters stay fp32 masters)."""
    torch.manual_seed(seed)
    model = Tiny()
    world = dist.get_world_size()
    if kind == "ddp":
        model = DistributedDataParallel(model)
    else:
        shape = (world,) if kind == "fsdp" else (2, world // 2)
        names = ("shard",) if kind == "fsdp" else ("replicate", "shard")
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16) if bf16 else MixedPrecisionPolicy()
        for module in (model.encoder, model.head, model):
            fully_shard(module, mesh=mesh, mp_policy=policy)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05, betas=(0.8, 0.9), weight_decay=0.01)
    return model, optimizer


def train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int, first_step: int = 0) -> None:
    """Each rank draws its own batch from a generator seeded by (step, rank): reproducible anywhere."""
    for step in range(first_step, first_step + steps):
        generator = torch.Generator().manual_seed(1000 * step + dist.get_rank())
        model(torch.randn(3, 6, generator=generator)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()


def training_step(step: int, kind: str, checkpoint_format: str) -> TrainingStep:
    world = dist.get_world_size()
    topology = {
        "fsdp": Topology(dp_shard=world),
        "hsdp": Topology(dp_replicate=2, dp_shard=world // 2),
        "ddp": Topology(dp_replicate=world),
    }[kind]
    return TrainingStep(
        step=step,
        dp_world_size=world,
        batch_size=3,
        grad_accum_steps=1,
        mixed_precision="no",
        topology=topology,
        checkpoint_format=checkpoint_format,
    )


def dump_full_state(model: nn.Module, optimizer: torch.optim.Optimizer, path: str) -> None:
    """Collective: gather the full model and optimizer state dicts; rank 0 writes them with torch.save."""
    model_sd = get_model_state_dict(model, options=FULL_ON_RANK0)
    optim_sd = get_optimizer_state_dict(model, optimizer, options=FULL_ON_RANK0)
    if dist.get_rank() == 0:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        torch.save({"model": model_sd, "optim": optim_sd}, path)
    dist.barrier()


def seed_rng_for_save() -> None:
    """Give each rank a known, distinct torch RNG state so the test can check rng_state.safetensors."""
    torch.manual_seed(7000 + dist.get_rank())


def finish() -> None:
    """Tear down, then leave without interpreter teardown (FSDP2 can abort a rank at exit)."""
    clean_exit.leave()
