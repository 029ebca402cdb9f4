"""Will the run's checkpoints fit on its disk? Said at the first save, hours before the disk fills.

A full disk already ends a run in one line with `last` intact; this module is about knowing early. At
the first committed save the size of that step directory and the free space of its disk give how many
more checkpoints fit; the save schedule (`--steps`, `--save_freq`, and `--env_eval_freq`'s saves for the
evaluator) and the retention (`--keep_last`, which `--keep_best`'s K best survive) give how many more the
run will need on disk at once. The forecast is one line in the log (a warning
when the run cannot reach `--steps`) and one record for the trackers. A bucket URL has no local free
space to read: the forecast is skipped with a note.
"""

from __future__ import annotations

import math
import os
import shutil
from dataclasses import dataclass

from ckpt_tools import layout
from trainer.config.sections import SavingSection

GIB = 2**30


@dataclass(frozen=True)
class Forecast:
    """How many more checkpoints fit (`room`) and how many more the run needs on disk (`needed`)."""

    step_bytes: int
    free_bytes: int
    room: int
    needed: int

    @property
    def fits(self) -> bool:
        return self.room >= self.needed


def saves_after(step: int, steps: int, save_freq: int, eval_every: int = 0) -> int:
    """Saves the schedule makes after `step` (schedule.py, `saves_at`): every `save_freq` steps, every
    `eval_every` steps (the evaluator's, --env_eval_freq; 0: none) and at the last step, a step that is
    a multiple of both saved once."""

    def multiples(every: int) -> int:
        return steps // every - step // every

    regular = multiples(save_freq)
    if eval_every:
        regular += multiples(eval_every) - multiples(math.lcm(save_freq, eval_every))
    last_is_regular = steps % save_freq == 0 or bool(eval_every and steps % eval_every == 0)
    return regular + (1 if not last_is_regular and step < steps else 0)


def more_on_disk(saves_left: int, on_disk: int, keep_last: int, keep_best: int = 0) -> int:
    """Step directories the run adds to the `on_disk` ones before it ends. With `keep_last` (0 keeps
    every step) retention deletes the oldest after a commit, so at most `keep_last` + the one being
    written are on disk at once, and `keep_best` more when --keep_best's best steps are older ones."""
    if not keep_last:
        return saves_left
    return max(0, min(on_disk + saves_left, keep_last + keep_best + 1) - on_disk)


def forecast(step_bytes: int, free_bytes: int, needed: int) -> Forecast:
    room = free_bytes // step_bytes if step_bytes > 0 else needed
    return Forecast(step_bytes, free_bytes, room, needed)


def directory_bytes(path: str) -> int:
    """Bytes of every file under `path` (a committed step directory)."""
    return sum(
        os.path.getsize(os.path.join(folder, name))
        for folder, _, names in os.walk(path)
        for name in names
        if not os.path.islink(os.path.join(folder, name))
    )


def first_save_note(step_dir: str, section: SavingSection) -> tuple[str, dict[str, float | str]]:
    """The log line and the tracker record (a `summary` of the trackers) of the forecast, at the
    run's first committed save `step_dir`."""
    if layout.is_url(step_dir):
        return f"disk forecast skipped: checkpoints go to {layout.parent(step_dir)}, a bucket URL", {}
    step = int(layout.name(step_dir))
    on_disk = sum(name.isdigit() for name in os.listdir(layout.parent(step_dir)))
    saves_left = saves_after(step, section.steps, section.save_freq, section.eval_every)
    kept_best = section.ranking.keep if section.ranking is not None else 0
    needed = more_on_disk(saves_left, on_disk, section.keep_last, kept_best)
    found = forecast(directory_bytes(step_dir), shutil.disk_usage(step_dir).free, needed)
    record: dict[str, float | str] = {
        "event": "disk_forecast",
        "steps": step,
        "checkpoint_gib": found.step_bytes / GIB,
        "free_gib": found.free_bytes / GIB,
        "checkpoints_room": found.room,
        "checkpoints_needed": found.needed,
    }
    sizes = (
        f"a checkpoint is {found.step_bytes / GIB:.3g} GiB and {found.free_bytes / GIB:.3g} GiB are free: room "
        f"for {found.room} more; reaching --steps={section.steps} needs {found.needed} more on disk"
    )
    if found.fits:
        return f"disk forecast: {sizes}", record
    return (
        f"warning: the disk will fill before the run ends: {sizes} (--save_freq={section.save_freq}, "
        f"{_evaluator_saves(section)}--keep_last={section.keep_last}); raise --save_freq, set --keep_last or free space",
        record,
    )


def _evaluator_saves(section: SavingSection) -> str:
    """The flags besides --save_freq and --keep_last that add step directories, for the warning."""
    flags = f"--env_eval_freq={section.eval_every}, " if section.eval_every else ""
    return flags + (f"--keep_best={section.ranking.keep}, " if section.ranking is not None else "")
