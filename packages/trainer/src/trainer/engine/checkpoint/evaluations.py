"""The run's side of scoring its checkpoints (docs/evaluation.md): the main rank's evaluator process,
the scores logged at their own steps, and the steps retention must keep.

With --env.type and --env_eval_freq the main rank launches ONE evaluator, `trainer eval --watch
OUTPUT_DIR` (evaluation/evaluator.py), in its own process: it reads only committed steps, so the
training ranks never wait for it and a sharded run needs nothing gathered for it. The run keeps the
steps the evaluator has yet to score out of `--keep_last`'s pruning, with `--keep_best`'s K best, and
logs each score when its eval.json appears (metrics.jsonl and the trackers, at the checkpoint's
training step; a resumed run logs those that landed while it was away, once). A run ranked by
`val_loss` writes that figure into each step's eval.json itself and moves `best`.

The evaluator's standard input is its control line: `finish` when the run ends (it scores what is
committed, then stops), closed without it when the run stops or dies (it stops after its current
step). Its output goes to `<output_dir>/evaluator.log`. Its death costs one line; the run goes on.
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
from trainer.evaluation.evaluator import is_due, is_env_scored, score_line
from trainer.reporting.loss_curve import event_steps
from trainer.reporting.metrics import METRICS_FILE, Logger

POLL_S = 2.0  # eval.json files are looked for at most this often (local); on a store:
URL_POLL_S = 15.0
LOG_FILE = "evaluator.log"
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
            ckpt_tools.write_scores(
                step_dir, {"step": step, "overall": {"val_loss": self.val_scores.pop(step)}}
            )
            if self.ranking is not None and self.ranking.metric == "val_loss":
                ckpt_tools.point_best(self.root, self.ranking)
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
            scores = _read(layout.join(self.root, name))
            if is_env_scored(scores):
                assert scores is not None
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
        run waits for it (at most `bound_s`) and logs the last scores."""
        if self.process is None:
            return
        _tell(self.process.stdin, b"finish\n")
        if wait:
            try:
                self.process.wait(timeout=bound_s)
            except subprocess.TimeoutExpired:
                self.process.terminate()
                self._lost(f"the evaluator took longer than {bound_s:.0f} s to score the last steps: stopped")
        self.poll(force=True)
        if wait:  # the steps kept for their scores are scored now: --keep_last applies to them too
            ckpt_tools.prune_steps(self.root, self.keep_last, self.keep())
        if self.pending:
            self.logger.note(
                f"steps {', '.join(sorted(self.pending))} are being scored after the run ended (their eval.json; "
                f"`trainer eval --watch {layout.parent(self.root)}` goes on where it stopped)"
            )

    def stop(self) -> None:
        """The run stops early (a signal): the evaluator stops after its current step."""
        if self.process is not None and self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()

    def _catch_up(self, output_dir: str, environment: EnvEvaluation) -> None:
        """A resumed run: log the scores that landed while no run was there (once), and wait for those
        of the steps still unscored."""
        if not storage.exists(self.root):
            return
        logged = event_steps(layout.join(output_dir, METRICS_FILE), "eval")
        for name in sorted(n for n in storage.list_names(self.root) if layout.is_step_dir_name(n)):
            if not is_due(int(name), environment.every, environment.last_step):
                continue
            scores = _read(layout.join(self.root, name))
            if not is_env_scored(scores):
                self.pending.add(name)
            elif int(name) not in logged:
                assert scores is not None
                self._log(name, scores)

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
        self.logger.note(
            f"evaluator: pid {process.pid}, scoring every {environment.every} steps; its log: {path}"
        )
        return process

    def _log(self, name: str, scores: dict[str, Any]) -> None:
        """One score in metrics.jsonl and the trackers, at its checkpoint's step."""
        step_dir = layout.join(self.root, name)
        overall = scores.get("overall", {})
        figures = {k: v for k, v in overall.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        videos = [layout.join(step_dir, path) for path in overall.get("video_paths", [])]
        problem = {"error": scores["error"]} if "error" in scores else {}
        record = {"event": "eval", "step": int(name), "env": scores.get("env"), **figures, **problem}
        self.logger.note(score_line(scores), **record, videos=videos)

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


def _read(step_dir: str) -> dict[str, Any] | None:
    try:
        return ckpt_tools.read_scores(step_dir)
    except ckpt_tools.CheckpointError:
        return None


def _tell(pipe: IO[bytes] | None, line: bytes) -> None:
    """A control line to the evaluator, then its input closed; an evaluator already gone is no error."""
    if pipe is None:
        return
    with contextlib.suppress(OSError):
        pipe.write(line)
        pipe.flush()
    with contextlib.suppress(OSError):
        pipe.close()


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
