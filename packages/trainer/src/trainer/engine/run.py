"""What a run builds before its first step: the types the loop, the save schedule, evaluation and
publishing share, in a module that imports none of them (what it reports at its end is
reporting/summary.py's `RunSummary`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

import ckpt_tools
from trainer.config.dataset import Dataset
from trainer.data.pipeline.feed import DataFeed
from trainer.data.pipeline.processors import Processor
from trainer.distributed.fault_tolerance import SINGLE_GROUP, SingleGroup
from trainer.engine.ema import Ema

if TYPE_CHECKING:
    from accelerate import Accelerator
    from accelerate.scheduler import AcceleratedScheduler


@dataclass(frozen=True)
class RunData:
    """The data the plan read to decide the policy's features, loaded once and trained on. Live objects
    (frames, decoders, open files), so they travel beside the plan rather than among its plain values."""

    dataset: Dataset
    val_dataset: Dataset | None
    """The held-out episodes val_loss scores (None: the run holds none out)."""


@dataclass
class Run:
    """Everything a run builds before its first step: prepared objects, the data feed (whose sampler
    a checkpoint records) and where to start."""

    topology: ckpt_tools.training.Topology
    accelerator: Accelerator
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: AcceleratedScheduler
    feed: DataFeed
    preprocessor: Processor
    postprocessor: Processor
    start_step: int
    check_lock: Callable[[], None] = lambda: None
    """Raises once another run took the output_dir over (the run lock's `check`, main rank)."""
    ema: Ema | None = None  # --ema.enable: the shadow of the trained parameters
    replicas: SingleGroup = SINGLE_GROUP
    """The replica group of a fault-tolerant run (--fault_tolerance.enable): quorum, the gradient average
    across groups, the commit; a run without it is one group that commits every step."""


def extra_weights(ema: Ema | None) -> dict[str, dict[str, torch.Tensor]]:
    """The weight sets a run keeps beside the model, by their name in ckpt_tools' weight-set table: what
    every checkpoint writes and a resume fills (`ema`, the shadow, with --ema.enable). Adding a set is its
    producer here."""
    return {} if ema is None else {"ema": ema.shadow}
