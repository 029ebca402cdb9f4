"""`trainer train` with each rank's peak resident memory (VmHWM) recorded at the end of each phase.

Usage: torchrun --nproc-per-node=N memory_worker.py OUT_DIR [trainer flags]

Phases: `built` (the policy built on meta, sharded, materialized, initialized, and `--policy.path`
weights read: `trainer.engine.build.after_prepare` returned), `first_step` (the first optimizer step
done: Adam's state allocated), `end` (the run over, its checkpoint saved). VmHWM only grows, so each
figure is the peak up to that point. Each rank writes OUT_DIR/rank<R>.json with the figures (bytes)
and the seconds since the process started.
"""

from __future__ import annotations

import json
import os
import sys
import time

START = time.monotonic()

import trainer.cli.app  # noqa: E402
import trainer.engine.build  # noqa: E402
import trainer.engine.committed_step  # noqa: E402
from trainer.cli import main  # noqa: E402

RECORD: dict[str, float] = {}


def vmhwm() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def mark(phase: str) -> None:
    RECORD[phase] = vmhwm()
    RECORD[f"{phase}_s"] = time.monotonic() - START


def after_phase(function, phase: str, once: bool = False):
    def wrapped(*args, **kwargs):
        result = function(*args, **kwargs)
        if not (once and phase in RECORD):
            mark(phase)
        return result

    return wrapped


def written_before(exit_process, out: str):
    """The CLI ends the process with `os._exit` (trainer/cli/app.py): write the record first."""

    def wrapped(*args, **kwargs):
        mark("end")
        with open(os.path.join(out, f"rank{os.environ.get('RANK', '0')}.json"), "w", encoding="utf-8") as f:
            json.dump(RECORD, f)
        exit_process(*args, **kwargs)

    return wrapped


if __name__ == "__main__":
    out, flags = sys.argv[1], sys.argv[2:]
    trainer.engine.build.after_prepare = after_phase(trainer.engine.build.after_prepare, "built")
    trainer.engine.committed_step._train_step = after_phase(
        trainer.engine.committed_step._train_step, "first_step", once=True
    )
    trainer.cli.app._exit = written_before(trainer.cli.app._exit, out)
    main(["train", *flags])
