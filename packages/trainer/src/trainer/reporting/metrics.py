"""Run output on the main rank: banner, log lines, a progress bar, metrics.jsonl, loss_curve.png and the
experiment trackers (trackers.py) that the run enables.

Non-main ranks get a `NullLogger` with the same methods, so the loop calls the logger on every rank
and never branches on the rank itself. The files go where the checkpoints go: a local directory or any
fsspec URL (`s3://bucket/run`, through `ckpt_tools.storage`).
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from ckpt_tools import layout, storage
from trainer.config.sections import TrackingSection
from trainer.errors import RunFailedError
from trainer.reporting.loss_curve import plot, read_history, read_text_or_empty
from trainer.reporting.trackers import GuardedTrackers, start_trackers

METRICS_FILE = "metrics.jsonl"
LOSS_CURVE_FILE = "loss_curve.png"
STORE_FLUSH_S = 30.0
"""On a store, training records reach metrics.jsonl at most this often (notes go at once)."""


class Logger(Protocol):
    """What the engine writes run output to: `MetricsLogger` on the main rank, `NullLogger` elsewhere."""

    def banner(self, lines: list[str]) -> None: ...

    def log(self, record: dict[str, Any]) -> None: ...

    def note(self, message: str, **record: Any) -> None: ...

    def record(self, record: dict[str, Any]) -> None: ...

    def advance(self, steps: int = 1) -> None: ...

    def first_loss(self, default: float) -> float: ...

    def check_writes(self, checkpoint: str | None, resume_hint: str) -> None: ...

    def close(self) -> None: ...


class MetricsLogger:
    """Writes every record to `<output_dir>/metrics.jsonl` and shows it on the console.

    On local disk each record is appended (and flushed) as it comes. An object on a store cannot be
    appended to: each write replaces it whole, so writing at every record would cost a run quadratic
    time in its length. There, training records are written at most every `STORE_FLUSH_S` seconds, and
    everything at each note (a checkpoint, a val loss, the start, an interruption, the summary) and at
    `close`: what a resumed run continues from, the records up to its checkpoint, is always written."""

    def __init__(
        self,
        output_dir: str,
        total_steps: int,
        start_step: int,
        tracking: TrackingSection | None = None,
        run_config: Mapping[str, Any] | None = None,
        progress: bool = True,
    ) -> None:
        """`tracking`: the trackers to start, recording `run_config` (the run's encoded config, as its
        train_config.json holds it); `progress=False`: no progress bar (the evaluator logging a run's
        late scores trains nothing)."""
        storage.makedirs(output_dir)
        self.dir = output_dir.rstrip("/")
        self.path = f"{self.dir}/{METRICS_FILE}"
        # Objects cannot be appended to: on a store the file is rewritten whole from this copy.
        self.text = None if storage.local_path(output_dir) is not None else read_text_or_empty(self.path)
        self._unwritten = False  # on a store: `text` holds records the object does not have yet
        self.write_failure: str | None = None  # set by a failed write, raised by `check_writes`
        self._written_at = time.monotonic()
        # No markup: lines hold paths and values, and `[...]` in a path would vanish as a style tag.
        self.console = Console(file=sys.stderr, highlight=False, soft_wrap=True, markup=False)
        # Trackers start before the progress bar, so what they print stays above it.
        trackers = (
            start_trackers(tracking, run_config or {}, self.console.print) if tracking is not None else []
        )
        self.trackers = GuardedTrackers(trackers, self.console.print)
        self.title = tracking.job_name if tracking is not None else layout.name(self.dir)
        self.progress: Progress | None = None
        if progress and self.console.is_terminal:
            self.progress = Progress(
                TextColumn("train"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                console=self.console,
            )
            self.task = self.progress.add_task("train", total=total_steps, completed=start_step)
            self.progress.start()

    def banner(self, lines: list[str]) -> None:
        for line in lines:
            self.console.print(line)
        self._append({"event": "start", "banner": lines, "time": time.time()})

    def log(self, record: dict[str, Any]) -> None:
        self._append({"event": "train", **record})
        self.trackers.log(record)
        parts = [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in record.items()]
        self.console.print(" ".join(parts))

    def record(self, record: dict[str, Any]) -> None:
        """A record for metrics.jsonl alone: no console line, no tracker (a retried push, say)."""
        self._append(record)

    def note(self, message: str, **record: Any) -> None:
        self.console.print(message)
        if record:
            self._append(record)
        self.flush()  # notes are rare and mark what must not be lost (a checkpoint's, above all)
        if record.get("event") == "val":  # val_loss, logged at its loop step like the training metrics
            self.trackers.log(record)
        if record.get("event") == "eval":  # a checkpoint's score, at that checkpoint's step
            self.trackers.scores(record, [v for v in record.get("videos", []) if storage.local_path(v)])
        if record.get("event") in ("summary", "disk_forecast"):
            self.trackers.summary(record)

    def advance(self, steps: int = 1) -> None:
        if self.progress is not None:
            self.progress.advance(self.task, steps)

    def close(self, plot: bool = True) -> None:
        """Write what is left, draw the loss curve (unless `plot` is False: nothing was trained since
        the run drew it) and finish the trackers."""
        if self.progress is not None:
            self.progress.stop()
        self.flush()
        if plot:
            self._plot()
        self.trackers.finish()

    def _append(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, sort_keys=True) + "\n"
        if self.text is None:
            if self.write_failure is None:
                with self._writing(), open(storage.absolute(self.path), "a", encoding="utf-8") as handle:
                    handle.write(line)
        else:
            self.text += line
            self._unwritten = True
            if time.monotonic() - self._written_at >= STORE_FLUSH_S:
                self.flush()

    def flush(self) -> None:
        """Write the records a store's metrics.jsonl does not have yet (local records are on disk)."""
        if self.text is not None and self._unwritten and self.write_failure is None:
            with self._writing():
                storage.write_bytes(self.path, self.text.encode("utf-8"))
                self._unwritten = False
                self._written_at = time.monotonic()

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """A failed metrics write (a full disk, a quota) does not end the run at once with a traceback:
        it is recorded and warned about once, and `check_writes` stops the run after its next save, so
        the steps trained meanwhile are kept."""
        try:
            yield
        except OSError as exc:
            self.write_failure = f"writing {self.path} failed ({exc.strerror or exc})"
            self.console.print(f"warning: {self.write_failure}; the run stops after its next checkpoint")

    def check_writes(self, checkpoint: str | None, resume_hint: str) -> None:
        """Raise `RunFailedError` (one line) when a metrics write failed; call after a save."""
        if self.write_failure is not None:
            saved = f"the run stopped after saving {checkpoint}" if checkpoint else "no checkpoint was saved"
            raise RunFailedError(f"{self.write_failure}: {saved}; free space, then resume with {resume_hint}")

    def _plot(self) -> None:
        """The whole run's curve, read back from metrics.jsonl (earlier segments included)."""
        history = read_history(self.path)
        if history.loss or history.val_loss:
            with self._writing():
                plot(history, f"{self.dir}/{LOSS_CURVE_FILE}", f"{self.title}: loss over the whole run")

    def first_loss(self, default: float) -> float:
        """The run's first logged loss, from before any resume (`default` when none was logged)."""
        self.flush()
        history = read_history(self.path)
        return history.loss[0][1] if history.loss else default


class NullLogger:
    """What the other ranks get: the same calls, no output."""

    def banner(self, lines: list[str]) -> None:
        pass

    def log(self, record: dict[str, Any]) -> None:
        pass

    def note(self, message: str, **record: Any) -> None:
        pass

    def record(self, record: dict[str, Any]) -> None:
        pass

    def advance(self, steps: int = 1) -> None:
        pass

    def first_loss(self, default: float) -> float:
        return default

    def check_writes(self, checkpoint: str | None, resume_hint: str) -> None:
        pass

    def close(self) -> None:
        pass


def make_logger(
    is_main: bool,
    output_dir: str,
    total_steps: int,
    start_step: int,
    tracking: TrackingSection | None = None,
    run_config: Mapping[str, Any] | None = None,
) -> Logger:
    """The one rank gate for run output, and for the experiment trackers `tracking` enables (each
    recording `run_config`)."""
    return (
        MetricsLogger(output_dir, total_steps, start_step, tracking, run_config) if is_main else NullLogger()
    )
