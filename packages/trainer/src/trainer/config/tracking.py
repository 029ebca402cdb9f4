"""Experiment trackers: `--wandb.*` and `--trackio.*`. Plain values; the libraries are imported only by
reporting/trackers.py, and only for a tracker a run enables."""

from __future__ import annotations

from dataclasses import dataclass

from trainer.errors import ConfigError

WANDB_MODES = ("online", "offline", "disabled")


@dataclass
class WandbConfig:
    """Weights & Biases (`pip install 'trainer[wandb]'`)."""

    enable: bool = False
    """Log the config, every metric and the summary to a W&B run (from the main process only)."""
    project: str = "trainer"
    """W&B project."""
    entity: str | None = None
    """W&B team or user; unset uses your default entity."""
    mode: str = "online"
    """online (needs WANDB_API_KEY or `wandb login`), offline (a local run directory under
    output_dir/wandb, `wandb sync` it later) or disabled."""
    notes: str | None = None
    """A description shown with the run."""
    run_id: str | None = None
    """Set by the trainer when the run starts and saved in train_config.json, so a resumed run
    (--resume=true) continues the same W&B run; a fresh run always starts a new one."""

    def __post_init__(self) -> None:
        if self.mode not in WANDB_MODES:
            raise ConfigError(f"--wandb.mode={self.mode!r} is not one of {', '.join(WANDB_MODES)}")


@dataclass
class TrackioConfig:
    """Trackio, local-first (`pip install 'trainer[trackio]'`): runs are kept in a local database
    (TRACKIO_DIR) and shown by `trackio show`."""

    enable: bool = False
    """Log the config, every metric and the summary to a trackio run (from the main process only)."""
    project: str = "trainer"
    """Trackio project."""
    run_name: str | None = None
    """Set by the trainer when the run starts and saved in train_config.json, so a resumed run
    (--resume=true) continues the same trackio run; a fresh run always starts a new one."""
