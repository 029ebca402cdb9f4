"""What the loop asks of the checkpoint wing, in the order it asks: save after a step (at
`--save_freq`, the evaluator's steps and the last step), commit or stop at an update boundary, finish,
publish.

The loop sees one object. Behind it: the save schedule (schedule.py), the pushes to the Hub while
training (hub_pushes.py, the main rank's, with --save_checkpoint_to_hub), the scores of the
checkpoints (evaluations.py, the main rank's evaluator and --keep_best) and the end-of-run publish
(publishing.py). The two resume phases run before the loop exists, around `prepare()` (resume.py).
"""

from __future__ import annotations

import ckpt_tools
from trainer.config.sections import EvaluationSection, SavingSection
from trainer.distributed.interrupt import Agreement
from trainer.engine.checkpoint import publishing
from trainer.engine.checkpoint.evaluations import Evaluations
from trainer.engine.checkpoint.hub_pushes import CheckpointPusher
from trainer.engine.checkpoint.schedule import SaveSchedule, check_writes
from trainer.engine.run import Run
from trainer.errors import USER_ERRORS, RunFailedError
from trainer.reporting.metrics import Logger
from trainer.reporting.summary import RunSummary


class Checkpoints:
    """Collective: every method is called on all ranks at the same steps."""

    def __init__(
        self,
        run: Run,
        section: SavingSection,
        evaluation: EvaluationSection,
        logger: Logger,
        resumed_from: str | None,
    ) -> None:
        """`resumed_from`: the step directory the run resumed from, pushed again in case the run
        before died before pushing it."""
        self.section, self.logger = section, logger
        self.environment = evaluation.environment
        main = run.accelerator.is_main_process
        self.pushes = (
            CheckpointPusher(section, logger) if section.hub.save_checkpoint_to_hub and main else None
        )
        if self.pushes is not None:
            self.pushes.resumed_from(resumed_from)
        scored = self.environment is not None or section.ranking is not None
        self.evaluations = Evaluations(section, self.environment, logger) if scored and main else None
        self.schedule = SaveSchedule(run, section, logger, self.pushes, self.evaluations)

    def writing(self) -> bool:
        """Whether this rank's background write is still running (a flag of the boundary's agreement)."""
        return self.schedule.writing()

    def after_step(self, step: int) -> None:
        """Save at `--save_freq`, at the steps the evaluator scores and at the last step."""
        self.schedule.after_step(step)

    def scored(self, step: int, val_loss: float) -> None:
        """The step's val_loss: written into its eval.json when it is saved, for --best_metric=val_loss."""
        ranking = self.section.ranking
        if self.evaluations is not None and ranking is not None and ranking.metric == "val_loss":
            self.evaluations.val_scores[step] = val_loss

    def at_boundary(self, step: int, agreement: Agreement) -> None:
        """Commit what every rank has written; on an agreed signal, save this step and raise
        `Interrupted`."""
        self.schedule.at_boundary(step, agreement)

    def interrupted(self) -> None:
        """The run stops on a signal after its save: the pushes end with the step just saved, the one
        a vanishing machine needs most; the evaluator stops after its current step."""
        if self.pushes is not None:
            self.pushes.close()
        if self.evaluations is not None:
            self.evaluations.stop()

    def finish(self) -> str | None:
        """Commit the write still in flight at the end of the loop, then tell the evaluator the run
        ended (with --eval.wait_at_end, every rank waits until it scored the last steps); the run's last
        checkpoint."""
        last = self.schedule.finish()
        environment = self.environment
        if environment is None or not environment.wait_at_end:
            if self.evaluations is not None:
                self.evaluations.finish(wait=False, bound_s=0.0)
            return last
        bound = environment.step_bound_s * (environment.last_step // environment.every + 2)
        with publishing.waiting_group(bound) as group:  # the other ranks wait for the main rank's evaluator
            ckpt_tools.training.main_decides(
                lambda: self.evaluations.finish(wait=True, bound_s=bound) if self.evaluations else None,
                error=RunFailedError,
                expected=USER_ERRORS,
                group=group,
            )
        return last

    def publish(self, summary: RunSummary) -> None:
        """After the loop and the logger's close: a metrics write that failed after the last save ends
        the run in one line; then the end-of-run publish (--policy.push_to_hub), after the pushes. The
        run writes nothing more: the evaluator logs the scores that land from now on."""
        try:
            check_writes(self.logger, self.section.output_dir, summary.last_checkpoint)
            publishing.publish_final(self.section, summary, self.logger, self.pushes)
        finally:
            if self.evaluations is not None:
                self.evaluations.hand_over()
