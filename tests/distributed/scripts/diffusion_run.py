"""LeRobot's Diffusion Policy checkpoint fine-tuned by the real trainer on gloo ranks, in one launch.

usage: diffusion_run.py OUT WORKDIR RUN...   (RUN: fsdp2 and ddp on 2 ranks, hsdp on 4)

WORKDIR holds LeRobot's checkpoint as `lerobot_diffusion_tiny/` and its dataset as `dataset_video/`.
Every run starts from that checkpoint (`--policy.path`), keeps an EMA (`--ema.enable=true`), takes 2
steps of 1 sample per rank with its 2-step observation history at a constant rate (the preset's cosine
reaches 0 at the last step, which would leave step 2 untrained), and saves at both steps (safetensors:
step 1's weights are the EMA's start).
`fsdp2`  FSDP2 on 2 ranks (the policy's units: the U-Net's residual blocks, the trunk's stages).
`ddp`    DDP on 2 ranks: the same samples, crops and noise per rank, so the same losses (saved at step 2
         only: its weights are compared, not its EMA).
`hsdp`   HSDP 2 replicas x 2 shards on 4 ranks.
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
    "--policy.path=lerobot_diffusion_tiny/pretrained_model", "--dataset.root=dataset_video",
    "--ema.enable=true", "--batch_size=1", "--num_workers=0", "--steps=2", "--save_freq=1",
    "--log_freq=1", "--seed=5", "--checkpoint_format=safetensors", "--use_policy_training_preset=false",
    "--optimizer.type=adam", "--optimizer.lr=1e-3", "--scheduler.type=constant", "--scheduler.warmup_steps=0",
]  # fmt: skip
TOPOLOGY = {
    "fsdp2": ["--parallelism.dp_shard=2"],
    "ddp": ["--parallelism.dp_shard=1", "--save_freq=2"],
    "hsdp": ["--parallelism.dp_replicate=2", "--parallelism.dp_shard=2"],
}


if __name__ == "__main__":
    os.chdir(WORKDIR)
    for run in RUNS:
        reset_accelerate()
        print(f"=== run {run}", flush=True)
        train(parse_config([*TUNE, *TOPOLOGY[run], f"--output_dir={OUT}/{run}"]))
    reset_accelerate()
    clean_exit.leave()
