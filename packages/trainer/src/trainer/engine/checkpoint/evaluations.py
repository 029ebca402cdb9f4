"""The run's side of scoring its checkpoints (docs/evaluation.md): the main rank's evaluator process,
the scores logged at their own steps, and the steps retention must keep.

With --env.type and --env_eval_freq the main rank launches ONE evaluator, `trainer eval --watch
OUTPUT_DIR` (evaluation/evaluator.py), in its own process: it reads only committed steps, so the
training ranks never wait for it and a sharded run needs nothing gathered for it. The run keeps the
steps the evaluator has yet to score out of `--keep_last`'s pruning, with `--keep_best`'s K best, and
logs each score when its eval.json appears (metrics.jsonl and the trackers, at the checkpoint's
training step; a resumed run logs those that landed while it was away, once). A run ranked by
`val_loss` writes that figure into each step's eval.json itself and moves `best`.

The evaluator's standard input is its control line: `finish` when the run ends and waits for the last
scores (`--eval.wait_at_end`: it scores what is committed, then stops, and the run logs them),
`finish log` when the run ends without waiting (it scores what is committed, and logs into
metrics.jsonl and the trackers itself what lands after the run closes its input, at the very end:
evaluation/score_log.py), the input closed without either when the run stops or dies (it stops after
its current step). Its output goes to `<output_dir>/evaluator.log`. Its death costs one line; the run
goes on.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import IO, Any

import ckpt_tools
from ckpt_tools import layout, storage
from trainer.config.sections import EnvEvaluation, SavingSection
from trainer.evaluation.evaluator import is_due, is_env_scored, read_scores_or_none, score_line
from trainer.evaluation.score_log import due_scores, log_score, not_logged
from trainer.reporting.metrics import Logger

POLL_S = 2.0  # eval.json files are looked for at most this often (local); on a store:
URL_POLL_S = 15.0
LOG_FILE = "evaluator.log"
STOP_S = 10.0  # an evaluator told to terminate is killed after this long
EVALUATOR_NICE = 10  # how far the evaluator's CPU priority is below the rank's (Unix nice, at most 19)
# a torchrun rank's identity, which the evaluator (one plain process) must not inherit
_LAUNCH_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK")
_LAUNCH_PREFIXES = ("MASTER_", "TORCHELASTIC_", "ACCELERATE_", "TORCH_NCCL_")


class Evaluations:
    """The main rank's: what the run does about its checkpoints' scores."""

    def __init__(self, saving: SavingSection, environment: EnvEvaluation | None, logger: Logger) -> None:
        self.root = layout.join(saving.output_dir, layout.CHECKPOINTS_DIR)
        self.ranking, self.environment, self.logger = saving.ranking, environment, logger
        self.keep_last = saving.keep_last
        self.pending: set[str] = set()  # committed steps the evaluator is to score, not logged yet
        self.val_scores: dict[int, float] = {}  # a val_loss-ranked run's figures, written at the commit
        self.process: subprocess.Popen[bytes] | None = None
        self._polled = 0.0
        self._poll_s = URL_POLL_S if layout.is_url(saving.output_dir) else POLL_S
        if environment is not None:
            self._catch_up(saving.output_dir, environment)
            self.process = self._launch(environment)
            if self.process is None:
                self.pending.clear()

    def committed(self, step_dir: str) -> None:
        """A step was committed: write its val_loss (a val_loss-ranked run), and wait for its score
        when the evaluator is to score it."""
        step = int(layout.name(step_dir))
        if step in self.val_scores:
            ckpt_tools.training.write_scores(
                step_dir, {"step": step, "overall": {"val_loss": self.val_scores.pop(step)}}
            )
            if self.ranking is not None and self.ranking.metric == "val_loss":
                ckpt_tools.training.point_best(self.root, self.ranking)
        env = self.environment
        if env is not None and self.process is not None and is_due(step, env.every, env.last_step):
            self.pending.add(layout.name(step_dir))
        self.poll(force=True)

    def poll(self, force: bool = False) -> None:
        """Log the scores that arrived (at most every few seconds unless `force`); notice a dead
        evaluator."""
        if not self.pending or (not force and time.monotonic() - self._polled < self._poll_s):
            return
        self._polled = time.monotonic()
        for name in sorted(self.pending):
            scores = read_scores_or_none(layout.join(self.root, name))
            if scores is not None and is_env_scored(scores):
                self._log(name, scores)
                self.pending.discard(name)
        if self.process is not None and self.process.poll() is not None and self.pending:
            self._lost(f"the evaluator stopped (exit {self.process.returncode})")

    def keep(self) -> frozenset[str]:
        """The steps retention must not delete: those waiting for their score, and --keep_best's."""
        best = ckpt_tools.best_steps(self.root, self.ranking) if self.ranking is not None else []
        return frozenset({*self.pending, *best})

    def finish(self, wait: bool, bound_s: float) -> None:
        """The run ended: the evaluator is told to score what is committed and stop; with `wait`, the
        run waits for it (at most `bound_s`) and logs the last scores, otherwise the evaluator logs
        those that land after `hand_over`."""
        if self.process is None:
            return
        _tell(self.process.stdin, b"finish\n" if wait else b"finish log\n", close=wait)
        if wait:
            try:
                self.process.wait(timeout=bound_s)
            except subprocess.TimeoutExpired:
                _end(self.process)
                self._lost(f"the evaluator took longer than {bound_s:.0f} s to score the last steps: stopped")
        self.poll(force=True)
        if wait:  # the steps kept for their scores are scored now: --keep_last applies to them too
            ckpt_tools.training.prune_steps(self.root, self.keep_last, self.keep())
        if self.pending:
            self.logger.note(
                f"steps {', '.join(sorted(self.pending))} are being scored after the run ended: the evaluator "
                "writes their eval.json and logs them into metrics.jsonl and the trackers (if it is stopped, "
                f"`trainer eval --watch {layout.parent(self.root)}` goes on where it stopped)"
            )

    def hand_over(self) -> None:
        """The run wrote its last record: its input closed after `finish log`, the evaluator logs the
        late scores itself."""
        self._close_input()

    def stop(self) -> None:
        """The run stops early (a signal): its input closed without `finish`, the evaluator stops after
        its current step."""
        self._close_input()

    def _close_input(self) -> None:
        if self.process is not None and self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()

    def _catch_up(self, output_dir: str, environment: EnvEvaluation) -> None:
        """A resumed run: log the scores that landed while no run was there (once), and wait for those
        of the steps still unscored."""
        scores = due_scores(output_dir, environment.every, environment.last_step)
        self.pending.update(name for name, s in scores if s is None or not is_env_scored(s))
        for name, landed in not_logged(output_dir, scores):
            self._log(name, landed)

    def _launch(self, environment: EnvEvaluation) -> subprocess.Popen[bytes] | None:
        """`trainer eval --watch OUTPUT_DIR` as a child of this rank, in its own process."""
        command = [
            sys.executable,
            "-m",
            "trainer.cli",
            "eval",
            f"--watch={environment.output_dir}",
            "--launched_by_run=true",
            "--idle_timeout_s=inf",
            *(f"--allow_types={name}" for name in environment.allow_types),
        ]
        environ = {
            key: value
            for key, value in os.environ.items()
            if key not in _LAUNCH_VARIABLES and not key.startswith(_LAUNCH_PREFIXES)
        }
        with _log_file(environment.output_dir) as (log, path):
            try:
                process = subprocess.Popen(
                    command, stdin=subprocess.PIPE, stdout=log, stderr=log, env=environ
                )
            except OSError as exc:
                self.logger.note(f"warning: the evaluator could not start ({exc}): the run trains without it")
                return None
        _step_aside(process, environment.cpus, self.logger)
        self.logger.note(
            f"evaluator: pid {process.pid}, scoring every {environment.every} steps; its log: {path}"
        )
        return process

    def _log(self, name: str, scores: dict[str, Any]) -> None:
        """One score in metrics.jsonl and the trackers, at its checkpoint's step."""
        log_score(self.logger, layout.join(self.root, name), scores, score_line(scores))

    def _lost(self, why: str) -> None:
        """The evaluator is gone: one line, and its unscored steps are no longer kept from pruning."""
        log = f"; its log: {layout.join(layout.parent(self.root), LOG_FILE)}" if self.environment else ""
        self.logger.note(
            f"warning: {why}{log}: steps {', '.join(sorted(self.pending))} stay unscored; the run goes on "
            f"(score them with `trainer eval --watch {layout.parent(self.root)}`)",
            event="evaluator_lost",
        )
        self.pending.clear()
        self.process = None


def _step_aside(process: subprocess.Popen[bytes], cpus: tuple[int, ...], logger: Logger) -> None:
    """The evaluator, as it starts, below the training ranks: a lower CPU priority (EVALUATOR_NICE, which
    its environment processes inherit), so that on cores it shares the ranks go first, and onto its own
    cores (--eval.cpus), where otherwise it would import torch and load its first checkpoint on the
    rank's cores, which it inherits, before moving itself."""
    with contextlib.suppress(OSError):  # a priority it cannot lower is no reason to stop
        below = min(19, os.getpriority(os.PRIO_PROCESS, 0) + EVALUATOR_NICE)
        os.setpriority(os.PRIO_PROCESS, process.pid, below)
    if not cpus:
        return
    try:
        os.sched_setaffinity(process.pid, cpus)
    except OSError as exc:  # it moves itself at its first score, or says why not in its log
        logger.note(f"warning: the evaluator could not be moved to --eval.cpus={list(cpus)} ({exc})")


def _tell(pipe: IO[bytes] | None, line: bytes, close: bool) -> None:
    """A control line to the evaluator (then its input closed, with `close`); an evaluator already
    gone is no error."""
    if pipe is None:
        return
    with contextlib.suppress(OSError):
        pipe.write(line)
        pipe.flush()
    if close:
        with contextlib.suppress(OSError):
            pipe.close()


def _end(process: subprocess.Popen[bytes]) -> None:
    """Terminate the evaluator, and kill it when it does not end within STOP_S."""
    process.terminate()
    try:
        process.wait(timeout=STOP_S)
    except subprocess.TimeoutExpired:
        process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):  # a process stuck in the kernel: left to it
            process.wait(timeout=STOP_S)


@contextlib.contextmanager
def _log_file(output_dir: str) -> Iterator[tuple[IO[bytes], str]]:
    """Where the evaluator writes: `<output_dir>/evaluator.log`, or a local file for a run on a store."""
    local = storage.local_path(output_dir)
    path = (
        os.path.join(local, LOG_FILE)
        if local is not None
        else os.path.join(tempfile.gettempdir(), f"trainer-{os.getpid()}-{LOG_FILE}")
    )
    with open(path, "ab") as handle:
        yield handle, path
