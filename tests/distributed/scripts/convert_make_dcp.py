"""Write the DCP checkpoints the conversion tests convert, from one torchrun launch.

Usage: torchrun --nproc-per-node=N convert_make_dcp.py OUT_DIR

Writes under OUT_DIR (every DCP directory next to a `reference.pt` gathered full state dict):
  fsdp/      plain FSDP2 model state (uneven shards: odd-sized layers), after one optimizer step
  combined/  `{"model": ..., "optim": ...}` from get_state_dict (a combined model+optimizer save)
  accelerate/pretrained_model/pytorch_model_fsdp_0/   `{"model": model.state_dict()}`, the layout
             accelerate's `save_state` writes under FSDP
  colshard/  a tensor sharded along dim 1 (DTensor Shard(1)), so chunks are not runs of rows
  hsdp/      (4 ranks only) the model under HSDP, a 2x2 (replicate x shard) mesh
"""

from __future__ import annotations

import os
import sys

import clean_exit
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Shard, distribute_tensor

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


class Tiny(nn.Module):
    """Odd sizes so shards are uneven; an integer buffer that a dtype cast must leave alone."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 6)
        self.body = nn.Sequential(nn.Linear(6, 13), nn.GELU(), nn.Linear(13, 5))
        self.head = nn.Linear(5, 3, bias=False)
        self.register_buffer("counts", torch.arange(7, dtype=torch.int64))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(ids)))


def build(mesh) -> Tiny:
    torch.manual_seed(0)
    model = Tiny()
    for layer in (model.embed, model.body):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def save_reference(model: nn.Module, directory: str) -> None:
    full = get_model_state_dict(model, options=FULL)
    if dist.get_rank() == 0:
        torch.save(full, os.path.join(directory, "reference.pt"))


def write_fsdp(out: str, world: int) -> None:
    model = build(init_device_mesh("cpu", (world,)))
    optim = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.arange(8).reshape(2, 4) % 11).sum().backward()
    optim.step()
    for name in ("fsdp", "combined", "accelerate/pretrained_model"):
        os.makedirs(os.path.join(out, name), exist_ok=True)
    dist.barrier()
    dcp.save(get_model_state_dict(model), checkpoint_id=os.path.join(out, "fsdp"))
    save_reference(model, os.path.join(out, "fsdp"))
    msd, osd = get_state_dict(model, optim)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=os.path.join(out, "combined"))
    save_reference(model, os.path.join(out, "combined"))
    accel = os.path.join(out, "accelerate", "pretrained_model")
    dcp.save({"model": model.state_dict()}, checkpoint_id=os.path.join(accel, "pytorch_model_fsdp_0"))
    save_reference(model, accel)


def write_colshard(out: str, world: int) -> None:
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(1)
    full = {"wide": torch.randn(3, 10), "rows": torch.randn(9, 4).to(torch.bfloat16)}
    state = {
        "wide": distribute_tensor(full["wide"], mesh, [Shard(1)]),
        "rows": distribute_tensor(full["rows"], mesh, [Shard(0)]),
    }
    directory = os.path.join(out, "colshard")
    dcp.save(state, checkpoint_id=directory)
    if dist.get_rank() == 0:
        torch.save(full, os.path.join(directory, "reference.pt"))


def write_hsdp(out: str) -> None:
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    model = build(mesh)
    directory = os.path.join(out, "hsdp")
    dcp.save(get_model_state_dict(model), checkpoint_id=directory)
    save_reference(model, directory)


def main() -> None:
    out = sys.argv[1]
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    write_fsdp(out, world)
    write_colshard(out, world)
    if world == 4:
        write_hsdp(out)
    clean_exit.leave()


if __name__ == "__main__":
    main()
