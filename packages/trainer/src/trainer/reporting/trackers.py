"""Experiment trackers (W&B, trackio) behind the main rank's logger.

`check_trackers` runs on every rank before any work, so a missing library or missing W&B credentials is
one line at start, not an exception hours later. `start_trackers` runs on the main rank only (the
logger gate, metrics.make_logger) and imports a library only for a tracker the run enables. Every call
into a tracker is guarded: a tracker that fails (network, disk) prints one warning and is dropped, and
training continues; the other ranks never wait on it, since the trackers take part in no collective.

A tracker's run id is decided by the run plan (`resolve_run_ids`, plan.py) before anything starts
(`--wandb.run_id`, `--trackio.run_name`), so train_config.json carries it and `--resume=true` continues
the same tracker run. Every rank decides one, but only the main rank's is ever used: it alone starts the
trackers and writes train_config.json.
"""

from __future__ import annotations

import importlib.util
import netrc
import os
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Literal, Protocol, cast
from urllib.parse import urlparse

import ckpt_tools
from trainer.config.sections import TrackingSection
from trainer.config.tracking import TrackioConfig, WandbConfig
from trainer.errors import ConfigError

WANDB_HOST = "https://api.wandb.ai"
EVAL_STEP = "eval/step"  # W&B's axis of the evaluation figures: the scored checkpoint's training step


class Tracker(Protocol):
    name: str

    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def summary(self, values: dict[str, float], step: int) -> None: ...

    def log_scores(self, metrics: dict[str, float], step: int, videos: list[str]) -> None:
        """A checkpoint's evaluation figures (`eval/<name>`), plotted at the checkpoint's training `step`
        even when they arrive later, with its episode videos (local mp4 files)."""
        ...

    def finish(self) -> None: ...


def check_trackers(wandb: WandbConfig, trackio: TrackioConfig, mode: str) -> None:
    """Refuse at start a tracker that cannot work: its library missing, or W&B online (`mode`, as
    `wandb_mode` decided it) without a key."""
    for flag, package, enabled in (
        ("--wandb.enable", "wandb", wandb.enable),
        ("--trackio.enable", "trackio", trackio.enable),
    ):
        if enabled and importlib.util.find_spec(package) is None:
            raise ConfigError(
                f"{flag}=true needs the {package} package: pip install 'trainer[{package}]' (or disable it)"
            )
    if wandb.enable and mode == "online" and not _wandb_credentials():
        raise ConfigError(
            "--wandb.mode=online needs W&B credentials: set WANDB_API_KEY or run `wandb login`, or log "
            "locally with --wandb.mode=offline or WANDB_MODE=offline (then `wandb sync` the run directory)"
        )


_ENV_MODES = {
    "online": "online",
    "run": "online",
    "offline": "offline",
    "dryrun": "offline",
    "disabled": "disabled",
}


def wandb_mode(configured: str, typed: bool) -> str:
    """The W&B mode the run uses, decided once for the pre-check and for `wandb.init`: a
    `--wandb.mode` flag typed for this run (`typed`) wins (wandb.init's arguments override the
    environment), then the environment W&B itself reads (`WANDB_MODE`, `WANDB_DISABLED=true`), then
    the configured mode."""
    if typed:
        return configured
    if os.environ.get("WANDB_DISABLED", "").lower() in ("true", "1", "yes"):
        return "disabled"
    return _ENV_MODES.get(os.environ.get("WANDB_MODE", "").strip().lower(), configured)


def resolve_run_ids(
    wandb: WandbConfig, trackio: TrackioConfig, resume: bool, job_name: str
) -> tuple[WandbConfig, TrackioConfig]:
    """The tracker settings with their run ids: a new id for each enabled tracker of a fresh run (a
    fresh run never continues an old tracker run), the saved one when a run resumes."""
    if wandb.enable and not (resume and wandb.run_id):
        wandb = replace(wandb, run_id=secrets.token_hex(4))  # W&B ids are short [a-z0-9] strings
    if trackio.enable and not (resume and trackio.run_name):
        trackio = replace(trackio, run_name=f"{job_name}-{time.strftime('%Y%m%d-%H%M%S')}")
    return wandb, trackio


def _wandb_credentials() -> bool:
    """An API key in the environment or in the netrc file `wandb login` writes."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", WANDB_HOST)).hostname or ""
    path = os.environ.get("NETRC") or os.path.expanduser("~/.netrc")
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def start_trackers(
    tracking: TrackingSection, run_config: Mapping[str, Any], warn: Callable[[str], None]
) -> list[Tracker]:
    """Main rank only. The enabled trackers, started, each recording `run_config` (the encoded config
    train_config.json holds); one that fails to start is a warning."""
    factories: list[tuple[str, bool, Callable[[TrackingSection, Mapping[str, Any]], Tracker]]] = [
        ("wandb", tracking.wandb.enable, WandbTracker),
        ("trackio", tracking.trackio.enable, TrackioTracker),
    ]
    trackers: list[Tracker] = []
    for name, enabled, factory in factories:
        if enabled:
            try:
                trackers.append(factory(tracking, run_config))
            except Exception as exc:  # a tracker must never stop training
                warn(
                    f"warning: {name} could not start ({ckpt_tools.one_line(exc, expected=())}): training continues without it"
                )
    return trackers


class GuardedTrackers:
    """Calls every tracker, dropping one (with one warning) the first time it raises."""

    def __init__(self, trackers: list[Tracker], warn: Callable[[str], None]) -> None:
        self.trackers = trackers
        self.warn = warn

    def log(self, record: dict[str, Any]) -> None:
        metrics = _numbers(record)
        self._each(lambda t: t.log(metrics, record["step"]))

    def summary(self, record: dict[str, Any]) -> None:
        self._each(lambda t: t.summary(_numbers(record), record["steps"]))

    def scores(self, record: dict[str, Any], videos: list[str]) -> None:
        metrics = _numbers(record)
        self._each(lambda t: t.log_scores(metrics, record["step"], videos))

    def finish(self) -> None:
        self._each(lambda t: t.finish())

    def _each(self, call: Callable[[Tracker], None]) -> None:
        for tracker in list(self.trackers):
            try:
                call(tracker)
            except Exception as exc:  # network, disk: warn once, keep training
                self.trackers.remove(tracker)
                self.warn(
                    f"warning: {tracker.name} logging failed ({ckpt_tools.one_line(exc, expected=())}): training continues without it"
                )


class WandbTracker:
    """One W&B run per training run; a resumed run continues it (its id is in train_config.json)."""

    name = "wandb"

    def __init__(self, tracking: TrackingSection, run_config: Mapping[str, Any]) -> None:
        import wandb

        settings = tracking.wandb  # its run_id decided by the run plan
        self.run = wandb.init(
            project=settings.project,
            entity=settings.entity,
            mode=cast(Literal["online", "offline", "disabled"], tracking.wandb_mode),  # as pre-checked
            notes=settings.notes,
            name=tracking.job_name,
            id=settings.run_id,
            resume="allow",
            dir=tracking.output_dir,
            config=dict(run_config),
        )
        self._eval_axis = False  # `eval/step` defined at the first score

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def summary(self, values: dict[str, float], step: int) -> None:
        self.run.summary.update(values)

    def log_scores(self, metrics: dict[str, float], step: int, videos: list[str]) -> None:
        """W&B's steps only grow, and a score arrives after training went past its checkpoint: the
        `eval/*` charts are drawn against their own axis, `eval/step` (the checkpoint's step), and the
        row joins the current one (commit=False) instead of moving W&B's step."""
        import wandb

        if not self._eval_axis:
            self.run.define_metric(EVAL_STEP)
            self.run.define_metric("eval/*", step_metric=EVAL_STEP)
            self._eval_axis = True
        row: dict[str, Any] = {f"eval/{key}": value for key, value in metrics.items()}
        row[EVAL_STEP] = step
        if videos:
            row["eval/video"] = wandb.Video(videos[0], format="mp4")
        self.run.log(row, commit=False)

    def finish(self) -> None:
        self.run.finish()


class TrackioTracker:
    """One trackio run per training run, in trackio's local store; a resumed run continues it."""

    name = "trackio"

    def __init__(self, tracking: TrackingSection, run_config: Mapping[str, Any]) -> None:
        import trackio

        settings = tracking.trackio  # its run_name decided by the run plan
        self.trackio = trackio
        self.run = trackio.init(
            project=settings.project,
            name=settings.run_name,
            resume="allow",
            config=dict(run_config),
            embed=False,
            auto_log_gpu=False,
            auto_log_cpu=False,
        )

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def summary(self, values: dict[str, float], step: int) -> None:
        """trackio has no run summary: the values are logged once at the last step, as summary/*."""
        self.run.log({f"summary/{key}": value for key, value in values.items()}, step=step)

    def log_scores(self, metrics: dict[str, float], step: int, videos: list[str]) -> None:
        """trackio stores each row with its step, so a late score is logged at its checkpoint's step."""
        row: dict[str, Any] = {f"eval/{key}": value for key, value in metrics.items()}
        if videos:
            row["eval/video"] = self.trackio.Video(videos[0], format="mp4")
        self.run.log(row, step=step)

    def finish(self) -> None:
        """trackio's own finish of its current run (this one): it also forgets the run, which trackio
        would otherwise finish again at exit, printing onto standard output after `--json`'s record."""
        self.trackio.finish()


def _numbers(record: dict[str, Any]) -> dict[str, float]:
    """The numeric fields of a metrics record, without its step and event keys."""
    return {
        key: value
        for key, value in record.items()
        if key not in ("step", "event") and isinstance(value, int | float) and not isinstance(value, bool)
    }
