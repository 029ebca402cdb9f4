"""A checkpoint's score in the run's metrics.jsonl and trackers, at the checkpoint's training step, by
whoever writes the run's files when it lands.

While a run is there, it logs the scores its evaluator writes (engine/checkpoint/evaluations.py), and a
resumed run those that landed while none was. A score that lands when no run is there is logged by the
evaluator itself (`log_landed`): the last steps of a run that ended without `--eval.wait_at_end`, or
the steps a standalone `trainer eval --watch` scores after the run ended. It takes the run's own lock
(distributed/runlock.py) while it writes, so no run writes metrics.jsonl meanwhile (a run starting in
that moment is refused in one line and can be started again a few seconds later); a run that holds
the lock is left to log them. metrics.jsonl records which steps are logged, so none is logged twice.

Once every step the run asked for is scored, the evaluator also applies the retention the run would have
applied had it waited for those scores (`prune_landed`): `--keep_last` steps and `--keep_best`'s K best,
under the same lock.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import ckpt_tools
from ckpt_tools import layout, storage
from trainer.config.sections import TrackingSection
from trainer.distributed.runlock import RunLock
from trainer.errors import ConfigError
from trainer.evaluation.evaluator import is_due, is_env_scored, read_scores_or_none, score_line
from trainer.reporting.loss_curve import event_steps
from trainer.reporting.metrics import METRICS_FILE, Logger, MetricsLogger

LOCK_POLL_S = 0.5

Scores = tuple[str, dict[str, Any] | None]  # a step's name and its eval.json (None: none yet)


def due_scores(output_dir: str, every: int, last_step: int) -> list[Scores]:
    """The committed steps the run asks to be scored (`evaluator.is_due`) with their eval.json, oldest
    first."""
    root = layout.join(output_dir, layout.CHECKPOINTS_DIR)
    if not storage.exists(root):
        return []
    names = sorted(name for name in storage.list_names(root) if layout.is_step_dir_name(name))
    return [
        (name, read_scores_or_none(layout.join(root, name)))
        for name in names
        if is_due(int(name), every, last_step)
    ]


def not_logged(output_dir: str, scores: Sequence[Scores]) -> list[tuple[str, dict[str, Any]]]:
    """The environment scores among `scores` that metrics.jsonl has no `eval` record of."""
    names = _unlogged(output_dir, [name for name, s in scores if s is not None and is_env_scored(s)])
    return [(name, s) for name, s in scores if name in names and s is not None]


def _unlogged(output_dir: str, names: Sequence[str]) -> list[str]:
    logged = event_steps(layout.join(output_dir, METRICS_FILE), "eval")
    return [name for name in names if int(name) not in logged]


def log_score(logger: Logger, step_dir: str, scores: dict[str, Any], line: str) -> None:
    """One score in metrics.jsonl (`{"event": "eval", "step": S, ...}`) and the trackers (`eval/*` at
    step S, with its first video), said as `line`."""
    overall = scores.get("overall", {})
    figures = {k: v for k, v in overall.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    videos = [layout.join(step_dir, path) for path in overall.get("video_paths", [])]
    problem = {"error": scores["error"]} if "error" in scores else {}
    step = int(layout.name(step_dir))
    logger.note(line, event="eval", step=step, env=scores.get("env"), **figures, **problem, videos=videos)


def log_landed(
    output_dir: str,
    scored: Sequence[str],
    tracking: Callable[[], tuple[TrackingSection, Mapping[str, Any]] | None],
    wait_s: float,
) -> list[str] | None:
    """Log the scores of the steps `scored` (steps holding an environment score) that metrics.jsonl
    lacks, when no run holds `output_dir` (waiting up to `wait_s` for one that is ending to let go).
    Returns the steps logged; None when a run holds it (or the store cannot be locked: then no one
    can tell that no run writes there)."""
    if not _unlogged(output_dir, scored):
        return []
    with _holding_run_lock(output_dir, wait_s) as held:
        if not held:
            return None
        root = layout.join(output_dir, layout.CHECKPOINTS_DIR)
        landed = not_logged(output_dir, [(n, read_scores_or_none(layout.join(root, n))) for n in scored])
        if not landed:  # logged meanwhile, by a run that has since let go
            return []
        section, run_config = tracking() or (None, None)  # the run's trackers and the config they record
        logger = MetricsLogger(output_dir, 0, 0, section, run_config, progress=False)
        try:
            for name, scores in landed:
                line = f"logged after the run ended: {score_line(scores)}"
                log_score(logger, layout.join(root, name), scores, line)
        finally:
            logger.close(plot=False)
        return [name for name, _ in landed]


def prune_landed(
    output_dir: str, keep_last: int, ranking: ckpt_tools.Ranking | None, wait_s: float
) -> list[str] | None:
    """The run's retention over its steps once their scores have landed after it ended: the
    `keep_last` newest and the K best by `ranking` stay, as the run keeps them when it waits for its
    scores (engine/checkpoint/evaluations.py). Returns the steps deleted; None when a run holds
    `output_dir` (it prunes at its next commit) or the store cannot be locked."""
    if keep_last < 1:
        return []
    with _holding_run_lock(output_dir, wait_s) as held:
        if not held:
            return None
        root = layout.join(output_dir, layout.CHECKPOINTS_DIR)
        best = ckpt_tools.best_steps(root, ranking) if ranking is not None else []
        return ckpt_tools.training.prune_steps(root, keep_last, best)


@contextlib.contextmanager
def _holding_run_lock(output_dir: str, wait_s: float) -> Iterator[bool]:
    """The run's lock, taken for the block (True), or False when a run holds it for longer than
    `wait_s` or the store has no exclusive create."""
    lock = RunLock(output_dir)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            lock.acquire()
            break
        except ConfigError:  # a run holds it
            if time.monotonic() >= deadline:
                yield False
                return
            time.sleep(LOCK_POLL_S)
    try:
        yield lock.owner is not None
    finally:
        lock.release()
