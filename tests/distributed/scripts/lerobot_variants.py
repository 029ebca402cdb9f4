"""LeRobot users' multi-GPU commands (FSDP with accumulation, HSDP, LoRA) unchanged but for this trainer's
parallelism flags, several per launch of 4 ranks (tests/distributed/test_lerobot_variants.py).

usage: lerobot_variants.py OUT DATASET_ROOT

`fsdp`: FSDP2 over 4 ranks, 2 micro-batches per update; `hsdp`: 2 replicas x 2 shards, with activation
checkpointing; `lora`: LoRA adapters on `fsdp`'s policy (--policy.path), FSDP2 over 4 ranks.
"""

from __future__ import annotations

import sys

import clean_exit
from fresh_accelerator import reset_accelerate

from trainer.cli.parse import parse_config
from trainer.engine.plan import train

OUT, ROOT, *SIZES = sys.argv[1:]  # SIZES: the policy flags that keep it tiny


def lerobot(run: str, *extra: str) -> list[str]:
    """The command of LeRobot's docs, with flags that keep it tiny (ACT's sizes among them)."""
    return [
        "--dataset.repo_id=someone/my_dataset",
        f"--dataset.root={ROOT}",
        "--policy.type=act",
        "--policy.repo_id=someone/my_policy",
        f"--output_dir={OUT}/{run}",
        f"--job_name=act_{run}",
        "--trackio.enable=true",
        "--batch_size=2",
        "--steps=2",
        "--save_freq=2",
        "--log_freq=1",
        *SIZES,
        *extra,
    ]


RUNS = [
    lerobot("fsdp", "--parallelism.dp_shard=4", "--accelerator.gradient_accumulation.steps=2"),
    lerobot(
        "hsdp",
        "--parallelism.dp_replicate=2",
        "--parallelism.dp_shard=2",
        "--accelerator.activation_checkpointing=true",
    ),
    lerobot(
        "lora",
        f"--policy.path={OUT}/fsdp/checkpoints/last",
        "--peft.method_type=LORA",
        "--peft.r=4",
        "--parallelism.dp_shard=4",
    ),
]

if __name__ == "__main__":
    for args in RUNS:
        train(parse_config(args))
        reset_accelerate()
    clean_exit.leave()
