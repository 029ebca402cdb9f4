"""A committed step's evaluation scores (`<step>/eval.json`), the ranking of the steps by one figure,
and the `best` pointer that names the top one.

A step is scored after its commit, by another process than the one that wrote it (an evaluator
following the run, docs/evaluation.md), so `eval.json` is no part of the step's manifest: it is
written whole, atomically (a rename on local disk, one object write on a store), and merged with what
an earlier writer left there (a run's `val_loss` and an environment's figures share the file). The
figures a ranking reads live under `overall` (lerobot-eval's `eval_info.json` names).

The ranking is read from the files each time it is needed, so it survives pruning, a resume and a
restarted evaluator: the K best steps are always among the steps still on disk, since retention
spares them (`best_steps` feeds `commit.prune_steps`' `keep`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ckpt_tools.errors import CheckpointError, CheckpointNotFoundError, UsageError
from ckpt_tools.files import commit
from ckpt_tools.files.storage import exists, json_bytes, list_names, local_path, read_json_object, write_bytes
from ckpt_tools.format import layout
from ckpt_tools.format.untrusted import MAX_CONFIG_BYTES

MODES = ("max", "min")


@dataclass(frozen=True)
class Ranking:
    """How the run ranks its steps: by `metric` (a figure of `overall` in eval.json), higher is better
    with `mode="max"`, lower with `"min"`; retention keeps the `keep` best."""

    metric: str
    mode: str = "max"
    keep: int = 1

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise UsageError(f"a ranking's mode is max or min, got {self.mode!r}", option="--best_mode")
        if self.keep < 1:
            raise UsageError(f"a ranking keeps at least 1 step, got {self.keep}", option="--keep_best")


def default_mode(metric: str) -> str:
    """Higher is better, except for a loss (`val_loss`, any name holding `loss`) or an error."""
    return "min" if "loss" in metric or "error" in metric or metric.endswith("_mse") else "max"


def scores_path(step_dir: str) -> str:
    return layout.join(step_dir, layout.EVAL_SCORES)


def read_scores(step_dir: str) -> dict[str, Any] | None:
    """The step's eval.json, or None when it has not been scored yet. A damaged file is a
    `CorruptCheckpointError` line naming it."""
    path = scores_path(step_dir)
    try:
        return read_json_object(path, MAX_CONFIG_BYTES)
    except CheckpointNotFoundError:
        return None


def write_scores(step_dir: str, scores: Mapping[str, Any]) -> dict[str, Any]:
    """Merge `scores` into the step's eval.json (its `overall` figures merged one by one, every other
    key replaced) and write the file whole; returns what it now holds."""
    merged = dict(read_scores(step_dir) or {})
    overall = {**merged.get("overall", {}), **scores.get("overall", {})}
    merged.update(scores)
    if overall:
        merged["overall"] = overall
    path = scores_path(step_dir)
    local = local_path(path)
    if local is None:
        write_bytes(path, json_bytes(merged))  # one object write: readers see the old or the new file
    else:
        tmp = f"{local}.tmp-{os.getpid()}"
        with open(tmp, "wb") as handle:
            handle.write(json_bytes(merged))
        os.replace(tmp, local)
    return merged


def figure(scores: Mapping[str, Any] | None, metric: str) -> float | None:
    """The finite value of `metric` in `scores['overall']`, else None (not scored, a failed
    evaluation, a NaN)."""
    overall = scores.get("overall") if scores else None
    value = overall.get(metric) if isinstance(overall, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def ranked_steps(checkpoints_dir: str, ranking: Ranking) -> list[tuple[str, float]]:
    """Every committed step holding a value of the ranking's figure, best first (a tie goes to the
    newer step). A step whose eval.json cannot be read is left out, not fatal: retention must go on."""
    root = checkpoints_dir.rstrip("/")
    if not exists(root):
        return []
    valued = []
    for name in list_names(root):
        if not layout.is_step_dir_name(name):
            continue
        try:
            value = figure(read_scores(layout.join(root, name)), ranking.metric)
        except CheckpointError:
            value = None
        if value is not None:
            valued.append((name, value))
    sign = -1.0 if ranking.mode == "max" else 1.0
    return sorted(valued, key=lambda item: (sign * item[1], -int(item[0])))


def best_steps(checkpoints_dir: str, ranking: Ranking) -> list[str]:
    """The names of the `ranking.keep` best steps (what retention spares)."""
    return [name for name, _ in ranked_steps(checkpoints_dir, ranking)[: ranking.keep]]


def point_best(checkpoints_dir: str, ranking: Ranking) -> str | None:
    """Move `checkpoints/best` to the best step (one atomic pointer write, as `last`); returns its name,
    None while no step holds the figure (`best` is then left as it is)."""
    ranked = ranked_steps(checkpoints_dir, ranking)
    if not ranked:
        return None
    name = ranked[0][0]
    commit.point(checkpoints_dir, layout.BEST, name)
    return name
