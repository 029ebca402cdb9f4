"""`trainer train` through the real CLI, with the weights it starts from recorded once they are real.

Usage: torchrun --nproc-per-node=N train_observe_init.py OBSERVED_PT [trainer flags]

`trainer.engine.build.after_prepare` is wrapped (nothing else changes): once the policy's tensors are
allocated and initialized, rank 0 writes OBSERVED_PT with
  state        the gathered full state dict (every parameter and persistent buffer);
  buffers      every buffer, the non-persistent ones too;
  placements   the first parameter's placements, showing the run is really sharded;
  same_params  whether materializing kept every parameter object (the optimizer holds them).
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.tensor import DTensor

import trainer.engine.build
from trainer.cli import main

real_after_prepare = trainer.engine.build.after_prepare


def observed_after_prepare(observed: str):
    def wrapped(built, config, device):
        before = [id(p) for p in built.policy.parameters()]
        real_after_prepare(built, config, device)
        model = built.policy
        same = before == [id(p) for p in model.parameters()]
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        buffers = {name: b.detach().cpu().clone() for name, b in model.named_buffers()}
        first = next(model.parameters())
        if not dist.is_initialized() or dist.get_rank() == 0:
            placements = str(first.placements) if isinstance(first, DTensor) else "plain tensor"
            torch.save(
                {"state": full, "buffers": buffers, "placements": placements, "same_params": same}, observed
            )

    return wrapped


if __name__ == "__main__":
    observed, flags = sys.argv[1], sys.argv[2:]
    trainer.engine.build.after_prepare = observed_after_prepare(observed)
    main(["train", *flags])
