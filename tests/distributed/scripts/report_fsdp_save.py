"""torchrun script: a 2-rank FSDP2 run saves one `safetensors_dcp` checkpoint with ckpt_tools.

The tiny model has odd-sized layers, so the DCP shards are uneven (7 rows split 4 + 3). The report
tests (inspect, verify, diff) read the result: real multi-chunk `.metadata` written by torch.
Usage: torchrun --nproc-per-node=2 report_fsdp_save.py OUTPUT_DIR
"""

from __future__ import annotations

import sys

import clean_exit
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import ckpt_tools
from ckpt_tools.format.meta import Topology, TrainingStep


def main(output_dir: str) -> None:
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 7), nn.ReLU(), nn.Linear(7, 3))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(2, 4)).square().mean().backward()
    optimizer.step()
    step = TrainingStep(
        step=1,
        dp_world_size=world,
        batch_size=2,
        grad_accum_steps=1,
        mixed_precision="no",
        topology=Topology(dp_shard=world),
        checkpoint_format="safetensors_dcp",
    )
    ckpt_tools.training.save_checkpoint(
        ckpt_tools.training.SaveRequest(
            checkpoints_dir=output_dir,
            training_step=step,
            model=model,
            optimizer=optimizer,
            policy_config={"type": "mlp"},
            train_config={},
        )
    )
    clean_exit.leave(barrier=False)


if __name__ == "__main__":
    main(sys.argv[1])
