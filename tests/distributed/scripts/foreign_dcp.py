"""Write DCP checkpoints the way other tools lay them out, from one torchrun launch (2 gloo ranks).

Usage: torchrun --nproc-per-node=2 foreign_dcp.py OUT_DIR

The model is FSDP2-sharded (convert_make_dcp's Tiny, uneven shards) and has taken one AdamW step, so
the optimizer holds real moments. Under OUT_DIR:
  titan/        torchtitan's CheckpointManager layout: `{**model_state_dict, "optimizer": optim_sd}`
                (model tensors at the top level beside a nested optimizer entry)
  titan_flat/   the same with the optimizer state dict flattened (`state.<param>.exp_avg` keys), as
                torchtitan's OptimizersContainer saves it
  ambiguous/    model tensors at the top level and a second copy nested under `ema`
  reference.safetensors   the gathered full model state dict (rank 0)
"""

from __future__ import annotations

import os
import sys

import clean_exit
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from convert_make_dcp import FULL, build
from safetensors.torch import save_file
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh


def main() -> None:
    out = sys.argv[1]
    dist.init_process_group("gloo")
    model = build(init_device_mesh("cpu", (dist.get_world_size(),)))
    optim = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.arange(8).reshape(2, 4) % 11).sum().backward()
    optim.step()
    model_sd = get_model_state_dict(model)
    nested = get_optimizer_state_dict(model, optim)
    flat = get_optimizer_state_dict(model, optim, options=StateDictOptions(flatten_optimizer_state_dict=True))
    dcp.save({**model_sd, "optimizer": nested}, checkpoint_id=os.path.join(out, "titan"))
    dcp.save({**model_sd, "optimizer": flat}, checkpoint_id=os.path.join(out, "titan_flat"))
    dcp.save({**model_sd, "ema": get_model_state_dict(model)}, checkpoint_id=os.path.join(out, "ambiguous"))
    full = get_model_state_dict(model, options=FULL)
    if dist.get_rank() == 0:
        save_file({k: v.contiguous() for k, v in full.items()}, os.path.join(out, "reference.safetensors"))
    clean_exit.leave()


if __name__ == "__main__":
    main()
