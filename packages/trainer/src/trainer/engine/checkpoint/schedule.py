"""When the loop saves, and the one background save that may be in flight.

A checkpoint is saved every `--save_freq` loop steps and at the last step: synchronously, or with
`--async_save` started in the background and committed later, once every rank's write is done (which
the signal check at each update boundary tells). The previous background write is committed before the
next one starts. On a signal every rank agreed on, the schedule commits what is in flight, saves the
step every rank stopped at (unless it just did) and raises `Interrupted`. With --save_checkpoint_to_hub
the main rank hands each committed step to its `CheckpointPusher`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from functools import partial

import ckpt_tools
from trainer.config.sections import SavingSection
from trainer.distributed.interrupt import Agreement, Interrupted
from trainer.engine.checkpoint import disk_forecast, saving
from trainer.engine.checkpoint.evaluations import Evaluations
from trainer.engine.checkpoint.hub_pushes import CheckpointPusher
from trainer.engine.run import Run, extra_weights
from trainer.errors import USER_ERRORS, RunFailedError
from trainer.reporting.metrics import Logger


class SaveSchedule:
    """The save side of the loop. Collective: every method is called on all ranks at the same steps."""

    def __init__(
        self,
        run: Run,
        section: SavingSection,
        logger: Logger,
        pushes: CheckpointPusher | None = None,
        evaluations: Evaluations | None = None,
    ) -> None:
        self.run, self.section, self.logger = run, section, logger
        self.pushes = pushes  # the main rank's, if any
        self.evaluations = evaluations  # the main rank's, if any
        self.last_checkpoint: str | None = None
        self._pending: ckpt_tools.training.PendingCheckpoint | None = None  # a background write not committed
        self._started_now = False  # the pending write was started by this step's save
        self._saved_step = -1

    def writing(self) -> bool:
        """Whether this rank's background write is still running (a flag of the boundary's agreement)."""
        return self._pending is not None and not self._pending.written()

    def after_step(self, step: int) -> None:
        """Save at `--save_freq` and at the last step."""
        section = self.section
        self._started_now = False
        if self.pushes is not None:
            self.pushes.poll()
        if self.evaluations is not None:
            self.evaluations.poll()
        if not self.saves_at(step):
            return
        self._commit_pending()
        if section.async_save and step != section.steps:
            self._owns_output_dir()
            self._pending = saving.start(section, self._state(step), **_saved_objects(self.run))
            self._started_now = True
        else:
            self._save(step)
        self._saved_step = step
        check_writes(self.logger, section.output_dir, self.last_checkpoint)  # a full disk stops the run here

    def saves_at(self, step: int) -> bool:
        """--save_freq, the steps the evaluator scores (--env_eval_freq) and the last step."""
        section = self.section
        every = section.eval_every
        return step % section.save_freq == 0 or bool(every and step % every == 0) or step == section.steps

    def at_boundary(self, step: int, agreement: Agreement) -> None:
        """The update boundary's agreed flags: commit a background write every rank has finished (any
        write, on a signal); on a signal, save this step unless it was just saved, and stop."""
        signum, writing = agreement.result()
        writing = writing or self._started_now  # just started: committed at a later boundary
        if not writing or signum:
            self._commit_pending()
        if signum:
            if self._saved_step != step:
                self._save(step)
            raise Interrupted(signum, step, self.last_checkpoint, resume_hint(self.section.output_dir))

    def finish(self) -> str | None:
        """Commit the write still in flight at the end of the loop; the run's last checkpoint."""
        self._commit_pending()
        return self.last_checkpoint

    def _commit_pending(self) -> None:
        if self._pending is not None:
            self._owns_output_dir()
            pending, self._pending = self._pending, None
            with self._retention() as keep:
                self._committed(saving.finish(self.section, pending, keep))

    def _save(self, step: int) -> None:
        self._owns_output_dir()
        with self._retention() as keep:
            state, objects = self._state(step), _saved_objects(self.run)
            self._committed(saving.save(self.section, state, keep=keep, **objects))

    def _committed(self, step_dir: str) -> None:
        first, self.last_checkpoint = self.last_checkpoint is None, step_dir
        self.logger.note(f"checkpoint {step_dir}")
        if first:  # will the rest of the run's checkpoints fit on this disk?
            line, record = disk_forecast.first_save_note(step_dir, self.section)
            self.logger.note(line, **record)
        if self.pushes is not None:
            self.pushes.submit(step_dir)
        if self.evaluations is not None:
            self.evaluations.committed(step_dir)

    @contextlib.contextmanager
    def _retention(self) -> Iterator[frozenset[str]]:
        """A commit, its retention and the hand-over of the step to the pushes, with the push queue held
        still (`CheckpointPusher.hold`): yields the steps retention keeps, those the evaluator has yet to
        score and --keep_best's included."""
        held = self.pushes.hold() if self.pushes is not None else contextlib.nullcontext(frozenset[str]())
        with held as keep:
            yield keep | (self.evaluations.keep() if self.evaluations is not None else frozenset())

    def _owns_output_dir(self) -> None:
        """Collective. A run whose output_dir another run took over (its lock's heartbeat found the
        other owner) commits nothing more: every rank raises the lock's one line."""
        ckpt_tools.training.main_decides(self.run.check_lock, error=RunFailedError, expected=USER_ERRORS)

    def _state(self, step: int) -> ckpt_tools.TrainingStep:
        run = self.run
        return saving.training_step(self.section, run.topology, step, run.feed.sampler.position)


def check_writes(logger: Logger, output_dir: str, checkpoint: str | None) -> None:
    """Collective. Every rank raises the logger's one line when a metrics write failed (a full disk):
    called after a save, so the steps trained since the failure are kept."""
    check = partial(logger.check_writes, checkpoint, resume_hint(output_dir))
    ckpt_tools.training.main_decides(check, error=RunFailedError, expected=USER_ERRORS)


def resume_hint(output_dir: str) -> str:
    return f"--resume=true --output_dir={os.path.abspath(output_dir)}"


def _saved_objects(run: Run) -> saving.SavedObjects:
    """What a checkpoint of the run holds besides its step: the unwrapped model and the rest."""
    return {
        "model": run.accelerator.unwrap_model(run.model),
        "optimizer": run.optimizer,
        "scheduler": run.scheduler,
        "scaler": run.accelerator.scaler,
        "preprocessor": run.preprocessor,
        "postprocessor": run.postprocessor,
        "extra_weights": extra_weights(run.ema),
    }
