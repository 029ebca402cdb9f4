"""What the loop asks of the checkpoint wing, in the order it asks: save after a step (at
`--save_freq` and the last step), commit or stop at an update boundary, finish, publish.

The loop sees one object. Behind it: the save schedule (schedule.py), the pushes to the Hub while
training (hub_pushes.py, the main rank's, with --save_checkpoint_to_hub) and the end-of-run publish
(publishing.py). The two resume phases run before the loop exists, around `prepare()` (resume.py).
"""

from __future__ import annotations

from trainer.config.sections import SavingSection
from trainer.distributed.interrupt import Agreement
from trainer.engine.checkpoint import publishing
from trainer.engine.checkpoint.hub_pushes import CheckpointPusher
from trainer.engine.checkpoint.schedule import SaveSchedule, check_writes
from trainer.engine.run import Run, RunSummary
from trainer.reporting.metrics import Logger


class Checkpoints:
    """Collective: every method is called on all ranks at the same steps."""

    def __init__(self, run: Run, section: SavingSection, logger: Logger, resumed_from: str | None) -> None:
        """`resumed_from`: the step directory the run resumed from, pushed again in case the run
        before died before pushing it."""
        self.section, self.logger = section, logger
        self.pushes = (
            CheckpointPusher(section, logger)
            if section.hub.save_checkpoint_to_hub and run.accelerator.is_main_process
            else None
        )
        if self.pushes is not None:
            self.pushes.resumed_from(resumed_from)
        self.schedule = SaveSchedule(run, section, logger, self.pushes)

    def writing(self) -> bool:
        """Whether this rank's background write is still running (a flag of the boundary's agreement)."""
        return self.schedule.writing()

    def after_step(self, step: int) -> None:
        """Save at `--save_freq` and at the last step."""
        self.schedule.after_step(step)

    def at_boundary(self, step: int, agreement: Agreement) -> None:
        """Commit what every rank has written; on an agreed signal, save this step and raise
        `Interrupted`."""
        self.schedule.at_boundary(step, agreement)

    def interrupted(self) -> None:
        """The run stops on a signal after its save: the pushes end with the step just saved, the one
        a vanishing machine needs most."""
        if self.pushes is not None:
            self.pushes.close()

    def finish(self) -> str | None:
        """Commit the write still in flight at the end of the loop; the run's last checkpoint."""
        return self.schedule.finish()

    def publish(self, summary: RunSummary) -> None:
        """After the loop and the logger's close: a metrics write that failed after the last save ends
        the run in one line; then the end-of-run publish (--policy.push_to_hub), after the pushes."""
        check_writes(self.logger, self.section.output_dir, summary.last_checkpoint)
        publishing.publish_final(self.section, summary, self.logger, self.pushes)
