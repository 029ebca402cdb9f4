"""The whole run's history from metrics.jsonl, and loss_curve.png drawn from it.

metrics.jsonl is appended to by every segment of a run (a first launch, then each resume), so it already
holds the history: a `resume` record marks where a segment continued from a checkpoint, and the records a
crashed segment logged after that checkpoint are superseded by the resumed segment's. A `start` record
followed by training without a `resume` is a new run in the same directory: the history restarts.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass, field
from typing import Any

from ckpt_tools import storage


@dataclass
class History:
    """(step, value) pairs of the whole run, in step order, and the steps it resumed at."""

    loss: list[tuple[int, float]] = field(default_factory=list)
    """The logged losses: each the mean over its log window."""
    val_loss: list[tuple[int, float]] = field(default_factory=list)
    resumes: list[int] = field(default_factory=list)
    step_loss: list[tuple[int, float]] = field(default_factory=list)
    """Every step's loss (the `step_losses` records each log line comes with; none in a run of a
    release before them)."""

    def _truncate(self, step: int) -> None:
        """Drop what a crashed segment logged after the checkpoint the next segment resumed from."""
        self.loss = [(s, v) for s, v in self.loss if s <= step]
        self.val_loss = [(s, v) for s, v in self.val_loss if s <= step]
        self.step_loss = [(s, v) for s, v in self.step_loss if s <= step]
        self.resumes = [s for s in self.resumes if s < step]


def read_text_or_empty(path: str | os.PathLike[str]) -> str:
    """A run file's text (local or on a store); empty before the run first wrote it."""
    return storage.read_text(path) if storage.exists(path) else ""


def event_steps(path: str | os.PathLike[str], event: str) -> set[int]:
    """The steps of the records of one `event` in metrics.jsonl (`eval`: the scores already logged,
    which a resumed run does not log twice)."""
    steps = set()
    for line in read_text_or_empty(path).splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line cut by a crash
            continue
        if isinstance(record, dict) and record.get("event") == event and isinstance(record.get("step"), int):
            steps.add(record["step"])
    return steps


def read_history(path: str | os.PathLike[str]) -> History:
    """The history of the run whose latest segment writes `path` (empty when there is no file); a local
    path or a URL."""
    history, fresh = History(), False
    lines = read_text_or_empty(path).splitlines()
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line cut by a crash
            continue
        event, step = record.get("event"), record.get("step")
        if event == "start":
            fresh = True
        elif event == "resume" and isinstance(step, int):
            fresh = False
            history._truncate(step)
            history.resumes.append(step)
        elif isinstance(step, int) and ("loss" in record or "val_loss" in record or event == "step_losses"):
            if fresh:  # training began without a resume: a new run, not a continuation
                history, fresh = History(), False
            for name in ("loss", "val_loss"):
                if isinstance(record.get(name), int | float):
                    getattr(history, name).append((step, float(record[name])))
            losses = record.get("losses") if event == "step_losses" else None
            if isinstance(losses, list):  # the window's steps, ending at `step`
                first = step - len(losses) + 1
                history.step_loss += [(first + i, float(v)) for i, v in enumerate(losses)]
    return history


def plot(history: History, path: str | os.PathLike[str], title: str) -> None:
    """Write loss_curve.png (a local path or a URL)."""
    import matplotlib.pyplot as plt

    fig = draw(history, title)
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=100)
    plt.close(fig)
    storage.write_bytes(path, image.getvalue())


def draw(history: History, title: str) -> Any:
    """The figure: every step's training loss, the logged window means and the validation loss over
    loop steps, resume points marked. Logged points carry markers, so a run that logged once still shows
    its point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    if len(history.step_loss) > 1:
        ax.plot(
            *zip(*history.step_loss, strict=True), "-", linewidth=0.8, alpha=0.5, label="loss (every step)"
        )
    for name, points, style in (("loss", history.loss, "-o"), ("val_loss", history.val_loss, "-s")):
        if points:
            ax.plot(*zip(*points, strict=True), style, markersize=3 if len(points) > 1 else 6, label=name)
    for i, step in enumerate(history.resumes):
        ax.axvline(step, color="grey", linestyle="--", linewidth=1, label="resumed" if i == 0 else None)
    ax.set_title(title)
    ax.set_xlabel("loop step")
    ax.set_ylabel("loss (mean over ranks)")
    if all(v > 0 for _, v in history.loss + history.val_loss + history.step_loss):
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig
