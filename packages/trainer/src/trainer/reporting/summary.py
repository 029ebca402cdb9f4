"""What a finished run reports: the values (the summary record in metrics.jsonl, the trackers' run
summary, what `trainer train` returns, what the model card quotes) and the line that says them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RunSummary:
    """What a finished run reports (every rank gets the same values, except `first_loss`: the run's
    first logged loss, before any resume, which the main rank reads from metrics.jsonl; the other ranks
    report their segment's first)."""

    steps: int
    first_loss: float
    final_loss: float
    policy_return: float
    random_return: float
    last_checkpoint: str | None
    episodes: int
    """Episodes the end-of-run evaluation rolled out, over every rank (0: none, and the returns mean
    nothing)."""

    def line(self) -> str:
        """The run's last log line: the evaluation's returns when it rolled episodes out, then the loss
        from the run's first logged value to its last."""
        rollouts = (
            f"evaluation over {self.episodes} episodes: policy return {self.policy_return:.1f}, "
            f"random policy return {self.random_return:.1f}; "
            if self.episodes
            else ""
        )
        return f"{rollouts}loss {self.first_loss:.4f} -> {self.final_loss:.4f}"
