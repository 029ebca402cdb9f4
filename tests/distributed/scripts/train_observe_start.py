"""`trainer train` through the real CLI, with the weights it starts from recorded once they are real.

Usage: torchrun --nproc-per-node=N train_observe_start.py OBSERVED_PT --policy.path=DIR [trainer flags]

The build's `after_prepare` is wrapped (nothing else changes): once accelerate has sharded the policy
and the build has materialized its shards and read --policy.path into them, rank 0 writes OBSERVED_PT
with
  started      the gathered full state dict the run trains from (what --policy.path loaded);
  dcp_loaded   DIR/pytorch_model_fsdp_0 read by `torch.distributed.checkpoint.load` straight into
               DTensors shaped like the run's own shards (a sharded load onto this topology), gathered;
  placements   the first parameter's placements, showing the run is really sharded.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.tensor import DTensor

import trainer.engine.startup
from ckpt_tools import layout
from trainer.cli import main
from trainer.engine.build import after_prepare

PATH_FLAG = "--policy.path="


def observed_after_prepare(observed: str, dcp_dir: str):
    def wrapped(built, config, device):
        after_prepare(built, config, device)
        model = built.policy  # sharded in place by prepare()
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        blank = {name: torch.zeros_like(value) for name, value in get_model_state_dict(model).items()}
        dcp.load(blank, checkpoint_id=dcp_dir)
        loaded = {n: v.full_tensor() if isinstance(v, DTensor) else v for n, v in blank.items()}
        first = next(model.parameters())
        if dist.get_rank() == 0:
            placements = str(first.placements) if isinstance(first, DTensor) else "plain tensor"
            torch.save({"started": full, "dcp_loaded": loaded, "placements": placements}, observed)

    return wrapped


if __name__ == "__main__":
    observed, flags = sys.argv[1], sys.argv[2:]
    policy_path = next(f.removeprefix(PATH_FLAG) for f in flags if f.startswith(PATH_FLAG))
    trainer.engine.startup.model_build.after_prepare = observed_after_prepare(
        observed, os.path.join(policy_path, layout.MODEL_DCP_DIR)
    )
    main(["train", *flags])
