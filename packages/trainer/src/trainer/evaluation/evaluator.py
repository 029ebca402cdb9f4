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
its line and its score; the evaluator goes on with the next step. A score that lands when no run is
there to log it (the run ended without `--eval.wait_at_end`, or a standalone evaluator follows a run
that has ended) is logged by the evaluator itself (`report`: score_log.py).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ckpt_tools
from ckpt_tools import layout, storage
from trainer.errors import ConfigError
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
    keep_last: int
    """The run's --keep_last (0 keeps every step), applied once the scores it did not wait for land."""


HANDOVER_S = 1800.0  # how long a launched evaluator waits for its ended run to let go of the run's files


class Control:
    """How the evaluator is told to stop, and whether it logs its scores itself.

    A standalone `trainer eval --watch` runs until the run's last step is scored, and logs each score
    into metrics.jsonl and the trackers itself when no run holds the output directory (`report`). One
    launched by a run reads its standard input: `finish` (the run ended and waits for the last scores:
    score what is committed, then stop), `finish log` (the run ended without waiting: score what is
    committed, and once the run closes this input, having written its last record, log the scores
    it did not), or the end of the input without either (the run died or was stopped: stop after the
    current step)."""

    def __init__(self, launched: bool) -> None:
        self.finishing = threading.Event()
        self.stopping = threading.Event()
        self.released = threading.Event()
        """No run tied to this evaluator writes the run's files any more."""
        self.logs = not launched
        """Whether this evaluator logs the scores that land (standalone, or told `finish log`)."""
        if launched:
            threading.Thread(target=self._read_stdin, daemon=True, name="evaluator-control").start()
        else:
            self.released.set()

    def _read_stdin(self) -> None:
        for line in sys.stdin:
            if line.split() in (["finish"], ["finish", "log"]):
                self.logs = line.split() == ["finish", "log"]
                self.finishing.set()
        if not self.finishing.is_set():
            self.stopping.set()
        self.released.set()

    def may_log(self) -> bool:
        """Whether a score may be logged now: this evaluator logs them, and its run let go."""
        return self.logs and self.released.is_set() and not self.stopping.is_set()


def follow(
    output_dir: str,
    plan_of: Callable[[str], StepPlan],
    score: Callable[[str, StepPlan], dict[str, Any]],
    report: Callable[[list[str], bool], None],
    say: Callable[[str], None],
    control: Control,
    idle_timeout_s: float,
) -> int:
    """Score the run's due steps as they are committed; returns how many were scored. `plan_of(step_dir)`
    reads a step's plan, `score(step_dir, plan)` scores it and returns its eval.json, `report(scored,
    final)` logs those of the scored steps that no run logged (after each score when `control` allows
    it, and once before stopping)."""
    root = layout.join(output_dir, layout.CHECKPOINTS_DIR)
    poll = URL_POLL_S if layout.is_url(output_dir) else POLL_S
    scored, idle_since, known = 0, time.monotonic(), _Scored(root)
    plan: StepPlan | None = None
    while not control.stopping.is_set():
        latest = _latest(root)
        plan = _plan_of_latest(latest, plan_of, output_dir)
        due = known.due(plan) if plan is not None else []
        if plan is not None and due:
            scored += _score_due(layout.join(root, due[0]), plan_of, score, say, known)
            if control.may_log():
                report(known.sorted(), False)
            idle_since = time.monotonic()
            continue
        stop = _stop_reason(plan, latest, known, control, time.monotonic() - idle_since, idle_timeout_s)
        if stop:
            say(stop)
            break
        control.stopping.wait(poll)
    if known.names and control.logs and not control.stopping.is_set():
        _report_at_end(known.sorted(), report, say, control)
    return scored


def _plan_of_latest(
    latest: str | None, plan_of: Callable[[str], StepPlan], output_dir: str
) -> StepPlan | None:
    """The run's plan as its latest step records it (None before its first commit); a run that scores
    in no environment, with none given on the command line, is refused in one line."""
    plan = plan_of(latest) if latest is not None else None
    if plan is not None and plan.scoring is None:
        raise ConfigError(
            f"the run in {output_dir} scores its checkpoints in no environment: give one, e.g. "
            "--env.type=pusht (with --env_eval_freq=N to score only every N steps)"
        )
    return plan


def _score_due(
    step_dir: str,
    plan_of: Callable[[str], StepPlan],
    score: Callable[[str, StepPlan], dict[str, Any]],
    say: Callable[[str], None],
    known: _Scored,
) -> int:
    """Score one due step, say its line and move `best`; 1 when it was scored, 0 when it vanished."""
    step_plan = plan_of(step_dir)
    result = _score_one(step_dir, step_plan, score, say)
    known.add(layout.name(step_dir))
    if result is None:
        return 0
    say(score_line(result))
    _move_best(layout.parent(step_dir), step_plan.ranking, say)
    return 1


def _stop_reason(
    plan: StepPlan | None,
    latest: str | None,
    known: _Scored,
    control: Control,
    idle_s: float,
    idle_timeout_s: float,
) -> str:
    """Why the evaluator stops now that nothing is due ("" to go on)."""
    if plan is not None and latest is not None and known.is_last_scored(latest, plan):
        return f"the run's last step {plan.last_step} is scored: the evaluator stops"
    if control.finishing.is_set():
        return "the run ended and every committed step it asked for is scored: the evaluator stops"
    if idle_s > idle_timeout_s:
        return f"no step to score for {idle_timeout_s:g} s: the evaluator stops (restart it to go on)"
    return ""


def _report_at_end(
    scored: list[str], report: Callable[[list[str], bool], None], say: Callable[[str], None], control: Control
) -> None:
    """Before stopping, log what landed: a launched evaluator first waits (bounded) for its run to
    write its last record."""
    if not control.released.wait(HANDOVER_S):
        say(
            f"the run did not end within {HANDOVER_S:g} s of its last step: the scores it did not log reach "
            "metrics.jsonl when it is resumed"
        )
        return
    report(scored, True)


def _latest(root: str) -> str | None:
    try:
        return ckpt_tools.latest_step_dir(root)
    except ckpt_tools.CheckpointError:
        return None  # a `last` being replaced, or broken: looked at again at the next poll


class _Scored:
    """The steps of `root` known to hold an environment score: read once each, then remembered (a
    score is never taken back), so a poll of a bucket reads only the eval.json files still missing."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.names: set[str] = set()

    def add(self, name: str) -> None:
        self.names.add(name)

    def sorted(self) -> list[str]:
        return sorted(self.names)

    def has(self, name: str) -> bool:
        if name not in self.names and is_env_scored(read_scores_or_none(layout.join(self.root, name))):
            self.names.add(name)
        return name in self.names

    def due(self, plan: StepPlan) -> list[str]:
        """The committed steps the run asked to be scored that hold no environment score yet, oldest
        first (a step the run's config gives no environment for is never due)."""
        if plan.scoring is None:
            return []
        names = sorted(name for name in storage.list_names(self.root) if layout.is_step_dir_name(name))
        return [
            name for name in names if is_due(int(name), plan.every, plan.last_step) and not self.has(name)
        ]

    def is_last_scored(self, latest: str, plan: StepPlan) -> bool:
        return int(layout.name(latest)) >= plan.last_step > 0 and self.has(layout.name(latest))


def is_due(step: int, every: int, last_step: int) -> bool:
    """Whether the run asks for step `step` to be scored: a multiple of --env_eval_freq (`every`; 0:
    every committed step) or its last step."""
    return not every or step % every == 0 or step == last_step


def is_env_scored(scores: dict[str, Any] | None) -> bool:
    """Whether an eval.json holds an environment's evaluation (figures, or the line why it failed)."""
    return scores is not None and "env" in scores


def read_scores_or_none(step_dir: str) -> dict[str, Any] | None:
    """A step's eval.json; None when it has none yet, or a damaged one (scored again, rewritten whole)."""
    try:
        return ckpt_tools.read_scores(step_dir)
    except ckpt_tools.CheckpointError:
        return None


def _score_one(
    step_dir: str,
    plan: StepPlan,
    score: Callable[[str, StepPlan], dict[str, Any]],
    say: Callable[[str], None],
) -> dict[str, Any] | None:
    """One step scored; None when it vanished meanwhile (pruned by `--keep_last`, or by a resumed
    run's retention): reading it, or writing its eval.json, then fails."""
    try:
        return score(step_dir, plan)
    except (ckpt_tools.CheckpointError, OSError) as exc:
        if storage.exists(step_dir):
            raise
        why = ckpt_tools.one_line(exc, expected=(Exception,))
        say(f"{layout.name(step_dir)} was removed before it was scored ({why}): skipped")
        return None


def _move_best(root: str, ranking: ckpt_tools.Ranking | None, say: Callable[[str], None]) -> None:
    """Point `best` at the best step when the run ranks by an environment's figure."""
    if ranking is not None and ranking.metric in FIGURES:
        best = ckpt_tools.training.point_best(root, ranking)
        if best is not None:
            say(f"best -> {best} ({ranking.metric}, {ranking.mode})")


def score_line(scores: dict[str, Any]) -> str:
    """One line for a step's eval.json (or a policy's eval_info.json): its figures, or why it has none."""
    step = scores.get("step")
    scored = f"step {step}" if step is not None else scores.get("policy")
    if "error" in scores:
        return f"{scored}: evaluation in {scores.get('env')} failed, score lost: {scores['error']}"
    overall = scores.get("overall", {})
    return (
        f"{scored}: {scores.get('env')} avg_sum_reward={overall.get('avg_sum_reward', float('nan')):.4g} "
        f"avg_max_reward={overall.get('avg_max_reward', float('nan')):.4g} "
        f"pc_success={overall.get('pc_success', float('nan')):.1f}% over {overall.get('n_episodes')} episodes "
        f"({overall.get('eval_s', 0.0):.1f} s)"
    )
