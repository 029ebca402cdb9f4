"""Camera ACT runs of the real trainer on 2 gloo ranks, all in one torchrun launch.

usage: act_camera_run.py OUT

`fsdp2` (FSDP2 over both ranks) and `ddp` (DDP) train the same tiny camera ACT on the embedded camera
task from the same seed, with rollouts at the end (select_action on every rank); `lora` fine-tunes the
fsdp2 result with LoRA under FSDP2. Each run is `trainer.loop.train(parse_config(flags))` in this
process; the test reads their metrics.jsonl, stdout and checkpoints.
"""

from __future__ import annotations

import os
import sys

import clean_exit

from trainer.cli.parse import parse_config
from trainer.engine.plan import train

OUT, *SIZES = sys.argv[1:]  # SIZES: the flags that narrow LeRobot's ACT to test sizes
TINY_CAMERA_ACT = ["--policy.type=act", *SIZES, "--policy.dropout=0", "--dataset.camera=true"]


def common(run: str) -> list[str]:
    return [
        f"--output_dir={OUT}/{run}",
        f"--dataset.cache_dir={OUT}/cache",
        "--dataset.episodes=2",
        "--log_freq=1",
        "--seed=3",
        "--batch_size=4",
    ]


RUNS = {
    "fsdp2": [*TINY_CAMERA_ACT, *common("fsdp2"), "--steps=2", "--save_freq=2", "--parallelism.dp_shard=2",
              "--dataset.eval_episodes=2"],
    "ddp": [*TINY_CAMERA_ACT, *common("ddp"), "--steps=2", "--save_freq=2", "--parallelism.dp_shard=1",
            "--dataset.eval_episodes=2"],
    "lora": [f"--policy.path={OUT}/fsdp2/checkpoints/last", "--dataset.camera=true", *common("lora"), "--peft.method_type=LORA",
             "--peft.r=2", "--steps=2", "--save_freq=2", "--parallelism.dp_shard=2", "--dataset.eval_episodes=0"],
}  # fmt: skip


def reset_accelerate() -> None:
    """A fresh Accelerator per run in this process (the process group stays)."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    for name in [n for n in os.environ if n.startswith(("ACCELERATE_", "FSDP_", "PARALLELISM_CONFIG_"))]:
        del os.environ[name]


if __name__ == "__main__":
    for run, flags in RUNS.items():
        reset_accelerate()
        print(f"=== run {run}", flush=True)
        train(parse_config(flags))
    reset_accelerate()
    clean_exit.leave()
