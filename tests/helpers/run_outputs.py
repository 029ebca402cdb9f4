"""What a `trainer train` run leaves in its output directory, read one way by every test: the records
of `metrics.jsonl` and the directories and files of a saved step (`checkpoints/<step>/pretrained_model/...`).

`run` is the run's `--output_dir`; `step` is a step number (2 is `000002`), a step directory's name or
a pointer (`last`, `best`). The names keep clear of the locals tests use most (`step_dir`, `model_dir`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ckpt_tools import layout

Step = int | str


def metrics(run: Path, event: str | None = None) -> list[dict[str, Any]]:
    """The records of `run/metrics.jsonl` in order; only those of `event` (`train`, `val`, `summary`,
    ...) when given."""
    lines = (Path(run) / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    return records if event is None else [r for r in records if r.get("event") == event]


def metrics_so_far(run: Path, event: str | None = None) -> list[dict[str, Any]]:
    """`metrics` of a run still writing: none before the file exists, and not a last line still being
    written (what a test polls while it waits for a record)."""
    path = Path(run) / "metrics.jsonl"
    if not path.exists():
        return []
    lines = [line for line in path.read_text().splitlines(keepends=True) if line.endswith("\n")]
    records = [json.loads(line) for line in lines]
    return records if event is None else [r for r in records if r.get("event") == event]


def saved_step(run: Path, step: Step = layout.LAST) -> Path:
    """`run/checkpoints/<step>`."""
    name = layout.step_dir_name(step) if isinstance(step, int) else step
    return Path(run) / layout.CHECKPOINTS_DIR / name


def saved_model(run: Path, step: Step = layout.LAST) -> Path:
    """The `pretrained_model/` of a step: what a LeRobot user loads."""
    return saved_step(run, step) / layout.PRETRAINED_MODEL_DIR


def model_file(run: Path, step: Step = layout.LAST, name: str = layout.MODEL_SAFETENSORS) -> Path:
    """An entry of a step's `pretrained_model/`: its weights by default, or `name` (a file, or a folder
    such as the DCP shards')."""
    return saved_model(run, step) / name


def committed_step(run: Path) -> int | None:
    """The step `checkpoints/last` names, the run's last committed one; None before its first commit.
    What a test waits for before killing a run that must resume from that step."""
    last = saved_step(run)
    if not last.is_symlink():
        return None
    return int(os.readlink(last))
