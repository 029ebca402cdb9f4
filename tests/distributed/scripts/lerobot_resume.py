"""`trainer train --resume=true --config_path=<LeRobot step>/pretrained_model/train_config.json`
through the real CLI, with the state the resume restored recorded before the first step.

Usage: torchrun --nproc-per-node=N lerobot_resume.py OBSERVED_PT CWD [trainer flags]

The run starts in CWD (LeRobot's train_config.json holds paths relative to the folder its run started
in). The resume's two phases are wrapped (nothing else changes): right after phase 1 every rank's
python, numpy and torch generator states are taken; right after phase 2 the gathered model and
optimizer state. Rank 0 writes OBSERVED_PT with
  rng          per rank: (python getstate(), numpy get_state(), torch get_rng_state()) after phase 1;
  model        the full model state dict after phase 2;
  optimizer    the full optimizer state dict after phase 2 (`state` keyed by FQN);
  start_step   the step the run continues from; offset: the sampler's sample offset;
  placements   the first parameter's placements, showing the topology the state was loaded onto.
The run then trains on to its --steps and saves, as any resumed run.
"""

from __future__ import annotations

import os
import random
import sys

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor

import trainer.engine.startup as startup
from trainer.cli import main

observed: dict[str, object] = {}


def _world() -> tuple[int, int]:
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def wrapped_before(before):
    def wrapped(section, topology, model, sampler, rank, world_size):
        point = before(section, topology, model, sampler, rank, world_size)
        mine = (random.getstate(), np.random.get_state(), torch.get_rng_state())
        states = [None] * world_size
        if dist.is_initialized():
            dist.all_gather_object(states, mine)
        else:
            states = [mine]
        observed.update(rng=states, start_step=point.start_step, offset=sampler.position[1])
        return point

    return wrapped


def wrapped_after(after):
    def wrapped(point, *, model, optimizer, scheduler, scaler, extra_weights=None):
        loaded = after(
            point,
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            scaler=scaler,
            extra_weights=extra_weights,
        )
        full = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model_state = get_model_state_dict(model, options=full)
        optimizer_state = get_optimizer_state_dict(
            model, getattr(optimizer, "optimizer", optimizer), options=full
        )
        first = next(model.parameters())
        if _world()[0] == 0:
            placements = str(first.placements) if isinstance(first, DTensor) else "plain tensor"
            observed.update(model=model_state, optimizer=optimizer_state, placements=placements)
            torch.save(observed, OBSERVED)
        return loaded

    return wrapped


if __name__ == "__main__":
    OBSERVED, cwd, flags = os.path.abspath(sys.argv[1]), sys.argv[2], sys.argv[3:]
    os.chdir(cwd)
    startup.resume.before_prepare = wrapped_before(startup.resume.before_prepare)
    startup.resume.after_prepare = wrapped_after(startup.resume.after_prepare)
    main(["train", *flags])
