"""Write a large FSDP2 DCP checkpoint for the conversion benchmark (run with torchrun, gloo, CPU).

Usage: torchrun --nproc-per-node=4 write_fsdp_dcp.py OUT_DIR SIZE_MB

The model is built on the meta device and materialized shard by shard, so no rank ever holds the
full model; it is saved as accelerate's `save_state` does under FSDP (`{"model": state_dict}` into
`pytorch_model_fsdp_0/`), the input every tool in the benchmark accepts.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

WIDTH = 2048  # one Linear(2048, 2048) is 16 MiB of fp32 weight


def main() -> None:
    out, size_mb = sys.argv[1], int(sys.argv[2])
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    layers = max(1, size_mb * 2**20 // (WIDTH * (WIDTH + 1) * 4))
    with torch.device("meta"):
        model = nn.Sequential(*(nn.Linear(WIDTH, WIDTH) for _ in range(layers)), nn.Linear(WIDTH, 7))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device="cpu")
    torch.manual_seed(dist.get_rank())
    with torch.no_grad():
        for param in model.parameters():
            param.to_local().normal_()
    dcp.save({"model": model.state_dict()}, checkpoint_id=os.path.join(out, "pytorch_model_fsdp_0"))
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # FSDP2 can abort at interpreter exit after all work succeeded


if __name__ == "__main__":
    main()
