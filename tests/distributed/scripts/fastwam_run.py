"""LeRobot's FastWAM checkpoint fine-tuned by the real trainer on gloo ranks, in one launch.

usage: fastwam_run.py OUT WORKDIR RUN...   (on 4 ranks: RUN among fsdp2, hsdp, ddp)

WORKDIR is a copy of tests/fixtures/lerobot_fastwam_tiny: LeRobot's checkpoint (`pretrained_model/`,
whose config names the frozen parts `./tiny_wan`, read from the working directory), its dataset
(`dataset/`). Every run starts from that checkpoint (`--policy.path`) and takes 2 steps of 1 sample
per rank with its 5-frame video window, at a constant rate, on every rank of the launch: the same
samples and draws per rank in each run, so the same losses.
`fsdp2`  FSDP2 over all 4 ranks (the policy's units: one per MoT layer and per projection in it, the
         embeddings, the heads).
`hsdp`   HSDP: 2 replicas x FSDP2 over 2 shards.
`ddp`    DDP on the same 4 ranks: the reference.
"""

from __future__ import annotations

import os
import sys

import clean_exit
from fresh_accelerator import reset_accelerate

from trainer.cli.parse import parse_config
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
}


if __name__ == "__main__":
    os.chdir(WORKDIR)
    for run in RUNS:
        reset_accelerate()
        print(f"=== run {run}", flush=True)
        train(parse_config([*TUNE, *TOPOLOGY[run], f"--output_dir={OUT}/{run}"]))
    reset_accelerate()
    clean_exit.leave()
