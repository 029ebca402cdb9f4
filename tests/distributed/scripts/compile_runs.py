"""FSDP2 runs (2 ranks) with activation checkpointing and compile, several per launch.

usage: compile_runs.py OUT

`plain`: 4 steps, no transforms; `fast`: the same with checkpointed and compiled wrap units (aot_eager);
`mixed`: 2 plain steps, then a resume to 4 with the transforms on. Every run saves safetensors and DCP.
`ddp_plain`, `ddp_fast`: the first two under DDP (2 replicas, safetensors).
"""

from __future__ import annotations

import sys

import clean_exit
from fresh_accelerator import reset_accelerate

from trainer.cli.parse import parse_config
from trainer.engine.plan import train

OUT = sys.argv[1]
FAST = [
    "--accelerator.activation_checkpointing=true",
    "--accelerator.compile=true",
    "--accelerator.compile_backend=aot_eager",
]


SHARDED = ["--parallelism.dp_shard=2", "--checkpoint_format=safetensors_dcp"]
DDP = ["--parallelism.dp_replicate=2", "--parallelism.dp_shard=1"]


def flags(run: str, *extra: str) -> list[str]:
    return [
        "--policy.type=mlp",
        "--policy.hidden_dim=16",
        "--policy.dropout=0.2",
        f"--output_dir={OUT}/{run}",
        f"--dataset.cache_dir={OUT}/cache",
        "--dataset.episodes=4",
        "--dataset.eval_episodes=0",
        "--batch_size=8",
        "--save_freq=2",
        "--log_freq=2",
        *extra,
    ]


RUNS = [
    flags("plain", "--steps=4", *SHARDED),
    flags("fast", "--steps=4", *SHARDED, *FAST),
    flags("mixed", "--steps=2", *SHARDED),
    flags("mixed", "--steps=4", "--resume=true", *SHARDED, *FAST),
    flags("ddp_plain", "--steps=4", *DDP),
    flags("ddp_fast", "--steps=4", *DDP, *FAST),
]

if __name__ == "__main__":
    for args in RUNS:
        train(parse_config(args))
        reset_accelerate()
    clean_exit.leave()
