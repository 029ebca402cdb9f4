"""The evaluator: follows a run's committed checkpoints and scores each in its environment.

It reads only what a commit made visible (`checkpoints/<step>/`, never a `.tmp-` directory or a live
shard), so it works the same beside a sharded run, after it, and on another machine (an `s3://` run
through ckpt_tools' storage). A step is due when the run asked for it (a multiple of `--env_eval_freq`,
or the run's last step) and its eval.json holds no environment score yet: a stopped evaluator
restarted later, or one a resumed run launches, scores exactly what was left. Each score is written
into the step (`env_scores.score_step`), and `best` is moved when the run ranks its steps by an
environment's figure (`--keep_best`).

It ends when the run's last step is scored, when it is told to (`Control`: the run that launched it
ended, or died), or after `idle_timeout_s` without a step to score. One evaluation that fails costs
its line and its score; the evaluator goes on with the next step.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ckpt_tools
from ckpt_tools import layout, storage
from trainer.evaluation.env_scores import FIGURES, EnvScoring

POLL_S = 1.0  # a local run's checkpoints/ is listed this often
URL_POLL_S = 10.0  # a bucket's: each listing is a request


@dataclass(frozen=True)
class StepPlan:
    """What one committed step asks of the evaluator (read from its train_config.json, flags applied):
    how to score it, which steps its run wants scored, its ranking."""

    scoring: EnvScoring | None
    """None: the run configured no environment and none was given on the command line."""
    every: int
    """Score the steps that are multiples of this (0: every committed step)."""
    last_step: int
    ranking: ckpt_tools.Ranking | None


class Control:
    """How the evaluator is told to stop. A standalone `trainer eval --watch` runs until the run's last
    step is scored; one launched by a run reads its standard input: `finish` (the run ended: score what
    is committed, then stop), or the end of the input without it (the run died: stop after the current
    step)."""

    def __init__(self, launched: bool) -> None:
        self.finishing = threading.Event()
        self.stopping = threading.Event()
        if launched:
            threading.Thread(target=self._read_stdin, daemon=True, name="evaluator-control").start()

    def _read_stdin(self) -> None:
        import sys

        for line in sys.stdin:
            if line.strip() == "finish":
                self.finishing.set()
                return
        self.stopping.set()


def follow(
    output_dir: str,
    plan_of: Callable[[str], StepPlan],
    score: Callable[[str, StepPlan], dict[str, Any]],
    say: Callable[[str], None],
    control: Control,
    idle_timeout_s: float,
) -> int:
    """Score the run's due steps as they are committed; returns how many were scored. `plan_of(step_dir)`
    reads a step's plan, `score(step_dir, plan)` scores it and returns its eval.json."""
    root = layout.join(output_dir, layout.CHECKPOINTS_DIR)
    poll = URL_POLL_S if layout.is_url(output_dir) else POLL_S
    scored, idle_since = 0, time.monotonic()
    while not control.stopping.is_set():
        latest = _latest(root)
        plan = plan_of(latest) if latest is not None else None
        due = _due_steps(root, plan) if plan is not None else []
        if plan is not None and due:
            step_dir = layout.join(root, due[0])
            step_plan = plan_of(step_dir)
            result = _score_one(step_dir, step_plan, score, say)
            if result is not None:
                scored += 1
                say(score_line(result))
                _move_best(root, step_plan.ranking, say)
            idle_since = time.monotonic()
            continue
        if plan is not None and latest is not None and _done(latest, plan):
            say(f"the run's last step {plan.last_step} is scored: the evaluator stops")
            break
        if control.finishing.is_set():
            say("the run ended and every committed step it asked for is scored: the evaluator stops")
            break
        if time.monotonic() - idle_since > idle_timeout_s:
            say(f"no step to score for {idle_timeout_s:g} s: the evaluator stops (restart it to go on)")
            break
        control.stopping.wait(poll)
    return scored


def _latest(root: str) -> str | None:
    try:
        return ckpt_tools.latest_step_dir(root)
    except ckpt_tools.CheckpointError:
        return None  # a `last` being replaced, or broken: looked at again at the next poll


def _due_steps(root: str, plan: StepPlan) -> list[str]:
    """The committed steps the run asked to be scored that hold no environment score yet, oldest
    first (a step the run's config gives no environment for is never due)."""
    if plan.scoring is None:
        return []
    names = sorted(name for name in storage.list_names(root) if layout.is_step_dir_name(name))
    wanted = [name for name in names if is_due(int(name), plan.every, plan.last_step)]
    return [name for name in wanted if not is_env_scored(_scores(layout.join(root, name)))]


def is_due(step: int, every: int, last_step: int) -> bool:
    """Whether the run asks for step `step` to be scored: a multiple of --env_eval_freq (`every`; 0:
    every committed step) or its last step."""
    return not every or step % every == 0 or step == last_step


def is_env_scored(scores: dict[str, Any] | None) -> bool:
    """Whether an eval.json holds an environment's evaluation (figures, or the line why it failed)."""
    return scores is not None and "env" in scores


def _scores(step_dir: str) -> dict[str, Any] | None:
    try:
        return ckpt_tools.read_scores(step_dir)
    except ckpt_tools.CheckpointError:
        return None  # damaged: scored again, and rewritten whole


def _done(latest: str, plan: StepPlan) -> bool:
    return int(layout.name(latest)) >= plan.last_step > 0 and is_env_scored(_scores(latest))


def _score_one(
    step_dir: str,
    plan: StepPlan,
    score: Callable[[str, StepPlan], dict[str, Any]],
    say: Callable[[str], None],
) -> dict[str, Any] | None:
    """One step scored; None when it vanished meanwhile (pruned by `--keep_last`)."""
    try:
        return score(step_dir, plan)
    except ckpt_tools.CheckpointError as exc:
        if storage.exists(step_dir):
            raise
        say(
            f"{layout.name(step_dir)} was removed before it was scored ({ckpt_tools.one_line(exc, expected=(Exception,))}): skipped"
        )
        return None


def _move_best(root: str, ranking: ckpt_tools.Ranking | None, say: Callable[[str], None]) -> None:
    """Point `best` at the best step when the run ranks by an environment's figure."""
    if ranking is not None and ranking.metric in FIGURES:
        best = ckpt_tools.point_best(root, ranking)
        if best is not None:
            say(f"best -> {best} ({ranking.metric}, {ranking.mode})")


def score_line(scores: dict[str, Any]) -> str:
    """One line for a step's eval.json: its figures, or why it has none."""
    step = scores.get("step")
    if "error" in scores:
        return f"step {step}: evaluation in {scores.get('env')} failed, score lost: {scores['error']}"
    overall = scores.get("overall", {})
    return (
        f"step {step}: {scores.get('env')} avg_sum_reward={overall.get('avg_sum_reward', float('nan')):.4g} "
        f"avg_max_reward={overall.get('avg_max_reward', float('nan')):.4g} "
        f"pc_success={overall.get('pc_success', float('nan')):.1f}% over {overall.get('n_episodes')} episodes "
        f"({overall.get('eval_s', 0.0):.1f} s)"
    )
