"""`--save_checkpoint_to_hub`: each committed checkpoint's model pushed to the Hub while training goes on.

A run on a machine that can disappear (a notebook, a spot instance) keeps on the Hub what it saved. The
main rank pushes from one background thread, one step at a time: the loop only hands it a committed
step directory. A step saved while another is uploading waits; a newer one replaces it (a line says
which was skipped), so at most one step is in flight and one waits. Each push is one Hub commit naming
the step, tagged `step-<step>` so any step loads by revision (`hf download REPO --revision
step-000500`); a DCP-only step is converted to safetensors in place first, and a run with an EMA pushes
the EMA weights, as the final publish does. Retention (`--keep_last`) spares the steps being pushed.

A failed push never stops training: transient failures (a server error, a rate limit, no connection)
are retried with backoff, the first failure is one warning line, later ones go to metrics.jsonl, and a
refusal (no write access) ends the pushes of the run. The end of the run waits for the last push, and
says which steps failed and how to push them by hand. A process killed mid-push leaves the repo as the
last completed commit left it: a Hub commit lands whole or not at all.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import ckpt_tools
from ckpt_tools import layout
from trainer.config.sections import SavingSection
from trainer.engine.checkpoint.saving import checkpoints_dir
from trainer.reporting.metrics import Logger

PUSH_ATTEMPTS = 3
RETRY_DELAY_S = 1.0  # before the second attempt; doubled before each later one


def step_tag(step_dir: str) -> str:
    """The tag naming a pushed step's commit: `step-000500`."""
    return f"step-{layout.name(step_dir)}"


class CheckpointPusher:
    """The main rank's pushes. `submit` and `poll` are called from the loop's thread, which alone writes
    to the logger: the push thread leaves its lines for `poll`."""

    def __init__(self, section: SavingSection, logger: Logger) -> None:
        self.section, self.logger = section, logger
        self.repo_id = str(section.hub.repo_id)
        self._lock = threading.RLock()  # `hold` keeps it across a commit, whose `submit` takes it again
        self._idle = threading.Condition(self._lock)
        self._in_flight: str | None = None
        self._waiting: str | None = None
        self._lines: list[tuple[str | None, dict[str, Any]]] = []  # (console line or None, record)
        self._failed: list[str] = []
        self._refused: str | None = None  # a push the Hub refused: the later ones are not attempted

    def submit(self, step_dir: str) -> None:
        """Push the committed `step_dir` now, or after the step in flight (replacing an older waiting one)."""
        with self._lock:
            if self._refused is not None:
                return
            if self._in_flight is None:
                self._in_flight = step_dir
                threading.Thread(target=self._work, name="hub-push", daemon=True).start()
                return
            if self._waiting is not None:
                self._say(
                    f"not pushing {_step(self._waiting)}: {_step(step_dir)} is newer and "
                    f"{_step(self._in_flight)} is still uploading",
                    event="hub_push_skipped",
                    step_dir=self._waiting,
                )
            self._waiting = step_dir
        self.poll()

    def resumed_from(self, step_dir: str | None) -> None:
        """Push the step a resumed run starts from when it is one of this run's own: the run before may
        have died before (or while) pushing it. Pushing a step again costs a commit, not an upload (the
        Hub keeps files by content)."""
        if step_dir is None or not _is_step_of(step_dir, self.section.output_dir):
            return
        self.logger.note(
            f"pushing {_step(step_dir)}, which this run resumes from, in case the run before did not"
        )
        self.submit(step_dir)

    @contextlib.contextmanager
    def hold(self) -> Iterator[frozenset[str]]:
        """Around a commit, its retention and the `submit` of the committed step: the push thread takes
        no other step meanwhile. Yields the name of the step in flight, which retention must keep; the
        waiting step may go, since the step being committed replaces it (were the queue to move during
        retention, the thread could start on a step just deleted)."""
        with self._lock:
            yield frozenset([layout.name(self._in_flight)] if self._in_flight else [])

    def poll(self) -> None:
        """Log what the push thread reported since the last call."""
        with self._lock:
            lines, self._lines = self._lines, []
        for line, record in lines:
            if line is None:
                self.logger.record(record)
            else:
                self.logger.note(line, **record)

    def close(self) -> None:
        """Wait for the push in flight and the one waiting, then say which steps failed. A second
        interrupt ends the wait (and the process) at once."""
        self.poll()
        with self._lock:
            busy = self._in_flight
        if busy is not None:
            self.logger.note(f"waiting for the push of {_step(busy)} to {self.repo_id}")
        with self._idle:
            self._idle.wait_for(lambda: self._in_flight is None)
        self.poll()
        if self._failed:
            names = ", ".join(layout.name(path) for path in self._failed)
            self.logger.note(
                f"warning: {len(self._failed)} checkpoint push(es) to {self.repo_id} failed (steps {names}); "
                f"the checkpoints are intact: push one with `ckpt push {self._failed[-1]} {self.repo_id}`",
                event="hub_push_failures",
                steps=[layout.name(path) for path in self._failed],
            )

    # --- the push thread ----------------------------------------------------------------------------

    def _work(self) -> None:
        with self._lock:
            step_dir = self._in_flight
        while step_dir is not None:
            self._push(step_dir)
            with self._idle:
                step_dir = None if self._refused is not None else self._waiting
                self._in_flight, self._waiting = step_dir, None
                if step_dir is None:
                    self._idle.notify_all()

    def _push(self, step_dir: str) -> None:
        """One step, with up to `PUSH_ATTEMPTS` attempts for a transient failure."""
        for attempt in range(1, PUSH_ATTEMPTS + 1):
            try:
                self._publish(step_dir)
                return
            except ckpt_tools.PublishError as exc:
                if not exc.transient:
                    self._fail(step_dir, exc, refused=True)
                    return
                if attempt == PUSH_ATTEMPTS:
                    self._fail(step_dir, exc, refused=False)
                    return
                delay = RETRY_DELAY_S * 2 ** (attempt - 1)
                with self._lock:
                    self._lines.append(
                        (
                            None,
                            {
                                "event": "hub_push_retry",
                                "step_dir": step_dir,
                                "attempt": attempt,
                                "error": str(exc),
                            },
                        )
                    )
                time.sleep(delay)
            except Exception as exc:  # a damaged step, a full disk while converting: this step only
                self._fail(step_dir, exc, refused=False)
                return

    def _publish(self, step_dir: str) -> None:
        checkpoint = ckpt_tools.open_checkpoint(step_dir)
        if not checkpoint.publishable:  # DCP shards only: the Hub needs safetensors
            ckpt_tools.convert_dcp_to_safetensors(step_dir, max_shard_size=self.section.shard_size)
        weights = checkpoint.default_weights
        name = layout.name(step_dir)
        result = ckpt_tools.publish_model(
            step_dir,
            self.repo_id,
            private=self.section.hub.private,
            commit_message=f"Checkpoint at step {name} ({weights} weights), pushed while training",
            endpoint=os.environ.get("HF_ENDPOINT"),
            weights=weights,
            tag=step_tag(step_dir),
            training_state=self.section.hub.push_training_state,
        )
        with self._lock:
            self._say(
                f"pushed {_step(step_dir)} ({weights} weights) to {self.repo_id} as {step_tag(step_dir)}",
                event="hub_push",
                step_dir=step_dir,
                tag=step_tag(step_dir),
                commit=result.commit_oid,
            )

    def _fail(self, step_dir: str, exc: Exception, *, refused: bool) -> None:
        detail = str(exc) if isinstance(exc, ckpt_tools.CheckpointError) else f"{type(exc).__name__}: {exc}"
        detail = " ".join(detail.split())
        later = "later steps are not pushed" if refused else "later steps are still pushed"
        with self._lock:
            first = not self._failed
            self._failed.append(step_dir)
            if refused:
                self._refused = detail
            record = {"event": "hub_push_failed", "step_dir": step_dir, "error": detail}
            line = f"warning: pushing {_step(step_dir)} to {self.repo_id} failed: {detail}; training goes on, {later}"
            self._lines.append((line if first or refused else None, record))

    def _say(self, line: str, **record: Any) -> None:
        """Leave a line for `poll` (the lock is held)."""
        self._lines.append((line, record))


def _is_step_of(step_dir: str, output_dir: str) -> bool:
    """Whether `step_dir` is a step directory of the run writing to `output_dir`."""
    if layout.is_url(output_dir):
        return layout.parent(step_dir.rstrip("/")) == checkpoints_dir(output_dir.rstrip("/"))
    return os.path.abspath(layout.parent(step_dir)) == os.path.abspath(checkpoints_dir(output_dir))


def _step(step_dir: str) -> str:
    return f"step {layout.name(step_dir)}"
