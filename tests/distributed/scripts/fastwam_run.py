"""LeRobot's FastWAM checkpoint fine-tuned by the real trainer on gloo ranks, in one launch.

usage: fastwam_run.py OUT WORKDIR RUN...   (on 4 ranks: RUN among fsdp2, hsdp, ddp, recompute)

WORKDIR is a copy of tests/fixtures/lerobot_fastwam_tiny: LeRobot's checkpoint (`pretrained_model/`,
whose config names the frozen parts `./tiny_wan`, read from the working directory), its dataset
(`dataset/`). Every run starts from that checkpoint (`--policy.path`) and takes 2 steps of 1 sample
per rank with its 5-frame video window, at a constant rate, on every rank of the launch: the same
samples and draws per rank in each run, so the same losses.
`fsdp2`  FSDP2 over all 4 ranks (the policy's units: one per MoT layer and per projection in it, the
         embeddings, the heads).
`hsdp`   HSDP: 2 replicas x FSDP2 over 2 shards.
`ddp`    DDP on the same 4 ranks: the reference.
`recompute`  `fsdp2` with `--policy.use_gradient_checkpointing=true`: every MoT layer run again in the
         backward pass. Each rank writes OUT/recompute/gathered.rank<R>.json: the most projection units
         of the MoT layers (a block's q, k, v, o and FFN Linears, each a unit inside its layer's)
         gathered at once during the backward pass, counted after each gather FSDP2 completes (torch
         internals; the counting stays installed, so give this run last).
"""

from __future__ import annotations

import json
import os
import sys

import clean_exit
import torch.distributed as dist
from fresh_accelerator import reset_accelerate

import trainer.engine.startup
from trainer.cli.parse import parse_config
from trainer.distributed.factory import prepare
from trainer.engine.plan import train

OUT, WORKDIR, *RUNS = sys.argv[1:]
TUNE = [
    "--policy.path=pretrained_model", "--dataset.root=dataset", "--dataset.repo_id=local/fastwam_tiny",
    "--batch_size=1", "--num_workers=0", "--steps=2", "--save_freq=2", "--log_freq=1", "--seed=5",
    "--checkpoint_format=safetensors", "--use_policy_training_preset=false", "--optimizer.type=adam",
    "--optimizer.lr=1e-3", "--scheduler.type=constant", "--scheduler.warmup_steps=0",
]  # fmt: skip
TOPOLOGY = {
    "fsdp2": ["--parallelism.dp_shard=4"],
    "hsdp": ["--parallelism.dp_replicate=2", "--parallelism.dp_shard=2"],
    "ddp": ["--parallelism.dp_shard=1"],
    "recompute": ["--parallelism.dp_shard=4", "--policy.use_gradient_checkpointing=true"],
}


def counting_gathered_projections(out: str):
    """The engine's `prepare`, then every completed gather in the backward pass counts the projection
    units gathered at that moment; the most is written when the optimizer first steps."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_common import is_bw
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    def wrapped(accelerator, policy, optimizer, scheduler, wrap_plan):
        model, optimizer, scheduler = prepare(accelerator, policy, optimizer, scheduler, wrap_plan)
        groups = [
            unit._get_fsdp_state()._fsdp_param_group
            for name, unit in model.named_modules()
            if isinstance(unit, FSDPModule)
            and ".layers." in name
            and type(unit).__name__.endswith("Projection")
        ]
        most = [0]
        wait = FSDPParamGroup.wait_for_unshard

        def counting_wait(group, *args, **kwargs):
            result = wait(group, *args, **kwargs)
            if is_bw():
                most[0] = max(most[0], sum(g.is_unsharded for g in groups))
            return result

        def write(*_args) -> None:
            path = os.path.join(out, f"gathered.rank{dist.get_rank()}.json")
            if not os.path.exists(path):
                with open(path, "w") as file:
                    json.dump({"projections": len(groups), "most_gathered": most[0]}, file)

        FSDPParamGroup.wait_for_unshard = counting_wait
        optimizer.optimizer.register_step_pre_hook(write)
        return model, optimizer, scheduler

    return wrapped


if __name__ == "__main__":
    os.chdir(WORKDIR)
    for run in RUNS:
        reset_accelerate()
        print(f"=== run {run}", flush=True)
        if run == "recompute":
            os.makedirs(f"{OUT}/{run}", exist_ok=True)
            trainer.engine.startup.prepare = counting_gathered_projections(f"{OUT}/{run}")
        train(parse_config([*TUNE, *TOPOLOGY[run], f"--output_dir={OUT}/{run}"]))
    reset_accelerate()
    clean_exit.leave()
