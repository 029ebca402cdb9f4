"""A real `accelerator.save_state` under FSDP2, built by the trainer's own accelerate factory.

Usage: torchrun --nproc-per-node=2 convert_accelerate_save_state.py OUT_DIR

The trainer's default ACT policy is sharded exactly as `trainer train --parallelism.dp_shard=2` shards
it (`build_accelerator` with its CPU FSDP2 adapter, then `prepare`), trained one step, and saved with
accelerate's own `save_state(OUT_DIR/state)`. Rank 0 writes OUT_DIR/reference.pt: the gathered full
state dict, the unwrapped model's parameter names and the first parameter's placements (showing the
model was really sharded), for the conversion test to compare against.
"""

from __future__ import annotations

import os
import sys

import clean_exit
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from trainer.config.parallelism import ParallelismConfig
from trainer.config.sections import ParallelismSection
from trainer.config.train import TrainConfig
from trainer.data.dataset import ACTION_KEY, OBS_KEY, PAD_KEY
from trainer.distributed.factory import build_accelerator, prepare
from trainer.distributed.topology import launch_world_size, resolve_topology
from trainer.distributed.wrap import resolve_wrap_plan
from trainer.engine.plan import seed_everything
from trainer.policies import build_policy

OBS_DIM, ACTION_DIM, BATCH = 3, 1, 4


def one_step(accelerator, model, optimizer, chunk: int) -> None:
    """A training step on a fixed synthetic batch (every rank its own rows)."""
    torch.manual_seed(accelerator.process_index)
    batch = {
        OBS_KEY: torch.randn(BATCH, OBS_DIM),
        ACTION_KEY: torch.randn(BATCH, chunk, ACTION_DIM),
        PAD_KEY: torch.zeros(BATCH, chunk, dtype=torch.bool),
    }
    loss, _ = model(batch)
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()


def main() -> None:
    out = sys.argv[1]
    config = TrainConfig(parallelism=ParallelismConfig(dp_shard=-1))
    topology = resolve_topology(config.parallelism, launch_world_size())
    seed_everything(config.seed)
    policy = build_policy(config.policy, OBS_DIM, ACTION_DIM)
    wrap_plan = resolve_wrap_plan(policy, config.accelerator.fsdp)
    accelerator = build_accelerator(ParallelismSection(topology, config.accelerator, 300), wrap_plan)
    optimizer = config.optimizer.build(policy.parameters())
    scheduler = config.scheduler.build(optimizer, 1)
    model, optimizer, scheduler = prepare(accelerator, policy, optimizer, scheduler, wrap_plan)
    one_step(accelerator, model, optimizer, config.policy.chunk_size)
    accelerator.save_state(os.path.join(out, "state"))
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    names = list(accelerator.unwrap_model(model).state_dict())
    placements = str(getattr(next(model.parameters()), "placements", "plain tensor"))
    if accelerator.is_main_process:
        reference = {"state": full, "names": names, "placements": placements}
        torch.save(reference, os.path.join(out, "reference.pt"))
    accelerator.wait_for_everyone()
    clean_exit.leave(barrier=False)


if __name__ == "__main__":
    main()
