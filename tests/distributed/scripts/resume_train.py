"""`trainer train` under torchrun, with the fault hooks the resume tests need (patched in here, so the
trainer itself carries no test code).

Hook flags come first and are removed before the trainer parses the rest:
  --hook-slow-save=SECONDS      rank 0 sleeps while writing a checkpoint's side files (the other ranks
                                wait at the save's barrier): saving must not deadlock when rank 0 is slow.
  --hook-kill-train=RANK:CALLS  RANK SIGKILLs itself at the start of its CALLS-th training step.
  --hook-kill-save=RANK:STEP    RANK SIGKILLs itself inside the save of step STEP, after the weights and
                                optimizer shards are written and before the step is committed.
Kills happen only in torchrun's first attempt (TORCHELASTIC_RESTART_COUNT=0), so a launch under
`--max-restarts` recovers by itself.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from hook_flags import install_hooks

import ckpt_tools.state.save as save
import trainer.engine.committed_step as committed_step
from trainer.cli import main

RANK = int(os.environ.get("RANK", "0"))
FIRST_ATTEMPT = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"


def _die() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def slow_save(seconds: float) -> None:
    write_side_files = save._write_side_files

    def slow(*args, **kwargs):
        print(f"hook: rank {RANK} writes the side files {seconds} s late", flush=True)
        time.sleep(seconds)
        return write_side_files(*args, **kwargs)

    save._write_side_files = slow


def kill_in_training(rank: int, calls: int) -> None:
    train_step = committed_step._train_step
    count = 0

    def step(*args, **kwargs):
        nonlocal count
        count += 1
        if FIRST_ATTEMPT and rank == RANK and count == calls:
            print(f"hook: rank {RANK} killed at its training step call {calls}", flush=True)
            _die()
        return train_step(*args, **kwargs)

    committed_step._train_step = step


def kill_in_save(rank: int, step: int) -> None:
    finish = save.PendingCheckpoint.finish

    def finish_or_die(pending, keep=()):
        if FIRST_ATTEMPT and rank == RANK and pending.step == step:
            for future in pending._futures:  # this rank's shards are written
                future.result()
            print(f"hook: rank {RANK} killed inside the save of step {step}", flush=True)
            _die()
        return finish(pending, keep)

    save.PendingCheckpoint.finish = finish_or_die


HOOKS = {
    "--hook-slow-save": slow_save,
    "--hook-kill-train": kill_in_training,
    "--hook-kill-save": kill_in_save,
}


if __name__ == "__main__":
    main(["train", *install_hooks(sys.argv[1:], HOOKS)])
