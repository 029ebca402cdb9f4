"""One rank of the bounded-memory load: a meta-built FSDP2 model (2 ranks) materialized, then a sharded
safetensors set loaded into its shards by `ckpt_tools.training.load_model_weights`. Writes this rank's peak
growth during the load (VmHWM reset just before it) and whether each local shard holds the saved rows.

argv: the sharded set's directory, the output JSON path prefix."""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from safetensors import safe_open
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import ckpt_tools
from ckpt_tools import layout

LAYERS, WIDTH = 6, 2048  # six 16 MiB fp32 weights: a 96 MiB set


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))


def main() -> None:
    source, out = sys.argv[1:]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    with torch.device("meta"):
        model = nn.Sequential(*(nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(LAYERS)))
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device="cpu")
    with torch.no_grad():
        for param in model.parameters():
            param.to_local().zero_()  # the shards resident, as an initialized build's are
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # VmHWM := VmRSS: the peak below is the load's own
    before = _status_kib("VmRSS")
    ckpt_tools.training.load_model_weights(source, model)
    grew_kib = _status_kib("VmHWM") - before
    with open(f"{source}/{layout.MODEL_INDEX}") as file:
        index = json.load(file)["weight_map"]
    same = []
    for name, value in model.state_dict().items():
        local = value.to_local()
        rows = local.shape[0]
        with safe_open(f"{source}/{index[name]}", framework="pt") as handle:
            saved = handle.get_slice(name)[rank * rows : (rank + 1) * rows]
        same.append(torch.equal(local, saved))
    with open(f"{out}.{rank}.json", "w") as file:
        json.dump({"grew_kib": grew_kib, "same": all(same), "shards": len(set(index.values()))}, file)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
