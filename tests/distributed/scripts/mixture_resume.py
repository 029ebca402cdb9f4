"""A camera ACT on a weighted mixture of the two LeRobot-written camera fixtures, 2 gloo ranks, all
runs in one torchrun launch.

usage: mixture_resume.py OUT MIXTURE_FILE [ACT size flags...]

`straight` trains 6 steps (checkpoints at 3 and 6); `cut` trains the same run's first 3 steps, then the
mixture file is removed and `cut` resumes with `--resume=true` and its output_dir alone (and the longer
`--steps=6`): the members come from its train_config.json. The test compares the two runs' step-6
weights and per-member sample counts, and resumes `straight`'s step 3 on one process too.
"""

from __future__ import annotations

import os
import sys

import clean_exit
import torch.distributed as dist
from fresh_accelerator import reset_accelerate

from trainer.cli.parse import parse_config
from trainer.engine.plan import train

OUT, MIXTURE, *SIZES = sys.argv[1:]
RUN = [
    "--policy.type=act",
    *SIZES,
    "--policy.dropout=0",
    "--policy.use_vae=false",  # no per-rank noise: a resume on one process differs by fp32 rounding only
    f"--dataset.mixture={MIXTURE}",
    "--use_policy_training_preset=false",  # the run chooses its own schedule
    "--scheduler.type=constant",
    "--dataset.eval_split=0.25",  # each member's last episode held out: val_loss per member
    "--eval_freq=3",
    "--num_workers=1",
    "--batch_size=2",
    "--log_freq=1",
    "--save_freq=3",
    "--seed=5",
]
RUNS = {
    "straight": [*RUN, "--steps=6", f"--output_dir={OUT}/straight"],
    "cut": [*RUN, "--steps=3", f"--output_dir={OUT}/cut"],
    "resumed": ["--resume=true", f"--output_dir={OUT}/cut", "--steps=6"],
}

if __name__ == "__main__":
    for run, flags in RUNS.items():
        if run == "resumed":
            dist.barrier()
            if dist.get_rank() == 0:
                os.replace(MIXTURE, MIXTURE + ".gone")  # the resumed run must not need it
            dist.barrier()
        reset_accelerate()
        print(f"=== run {run}", flush=True)
        train(parse_config(flags))
    reset_accelerate()
    clean_exit.leave()
