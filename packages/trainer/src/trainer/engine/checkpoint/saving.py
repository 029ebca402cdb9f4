"""Checkpoints through ckpt-tools only: this module builds the inputs, ckpt_tools writes every file."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Collection, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypedDict

import torch

import ckpt_tools
from ckpt_tools import TrainingStep, layout
from ckpt_tools.training import SamplerPosition, Topology
from trainer.config.sections import SavingSection
from trainer.data.pipeline.processors import Processor
from trainer.engine.peft_policy import adapter_config
from trainer.errors import CheckpointSaveError, ConfigError

if TYPE_CHECKING:
    from accelerate.scheduler import AcceleratedScheduler
    from typing_extensions import NotRequired, Unpack


class SavedObjects(TypedDict):
    """What a checkpoint holds besides its step (`save`'s and `start`'s keyword arguments)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: AcceleratedScheduler
    scaler: torch.amp.GradScaler | None
    preprocessor: Processor
    postprocessor: Processor
    extra_weights: NotRequired[Mapping[str, Mapping[str, torch.Tensor]]]
    """The weight sets beside the model, by name (the --ema.enable shadow as `ema`)."""


def checkpoints_dir(output_dir: str) -> str:
    return layout.join(output_dir, layout.CHECKPOINTS_DIR)


def check_fresh_output_dir(output_dir: str, resume: bool) -> None:
    """A new run must not mix its checkpoints with an older run's."""
    if resume:
        return
    try:
        holds = ckpt_tools.latest_step_dir(output_dir) is not None
    except ckpt_tools.CheckpointError as exc:  # a broken `last` is still an older run's
        raise ConfigError(f"--output_dir={output_dir} holds a broken checkpoint pointer: {exc}") from None
    if holds:
        raise ConfigError(
            f"--output_dir={output_dir} already holds checkpoints: choose another --output_dir, "
            "or continue that run with --resume=true"
        )


def check_async_save(async_save: bool, topology: Topology) -> None:
    """--async_save writes DCP shards in the background: only a sharded run has them."""
    if async_save and not topology.is_sharded:
        raise ConfigError(
            f"--async_save=true writes a sharded run's DCP shards in the background, and this "
            f"{topology.describe()} run has none: shard it (--parallelism.dp_shard=N) or drop --async_save"
        )


def saved_config(section: SavingSection) -> dict[str, Any]:
    """train_config.json: the run's config with its absolute output_dir (parse_config resolves it) and
    `resume` stored false, so the file alone reproduces the run from its start; continuing the run is
    what `--resume=true` asks for."""
    return {**section.train_config, "resume": False}


def training_step(
    section: SavingSection, topology: Topology, step: int, position: tuple[int, int]
) -> TrainingStep:
    return TrainingStep(
        step=step,
        dp_world_size=topology.dp_world_size,
        batch_size=section.batch_size,
        grad_accum_steps=section.grad_accum_steps,
        mixed_precision=section.mixed_precision,
        topology=topology,
        checkpoint_format=section.checkpoint_format,
        sampler=SamplerPosition(epoch=position[0], offset=position[1]),
        seed=section.seed,
        peft=section.peft,
    )


def save(
    section: SavingSection,
    state: TrainingStep,
    *,
    keep: Collection[str] = (),
    **objects: Unpack[SavedObjects],
) -> str:
    """Collective: call on all ranks. `start` then `finish`: the step committed; returns its directory."""
    return finish(section, start(section, state, **objects), keep)


def start(
    section: SavingSection,
    state: TrainingStep,
    **objects: Unpack[SavedObjects],
) -> ckpt_tools.training.PendingCheckpoint:
    """Collective: call on all ranks. Writes the step (its DCP shards in the background with
    --async_save) and returns the pending checkpoint that `finish` commits."""
    processors = {
        layout.PREPROCESSOR: ckpt_tools.ProcessorState(*objects["preprocessor"].state()),
        layout.POSTPROCESSOR: ckpt_tools.ProcessorState(*objects["postprocessor"].state()),
    }
    with _one_line(section):
        return ckpt_tools.training.start_checkpoint(
            ckpt_tools.training.SaveRequest(
                checkpoints_dir=checkpoints_dir(section.output_dir),
                training_step=state,
                model=objects["model"],
                optimizer=objects["optimizer"],
                policy_config=dict(section.policy_config),
                train_config=saved_config(section),
                processors=processors,
                scheduler=objects["scheduler"],
                scaler=objects["scaler"],
                adapter_config=adapter_config(objects["model"], section.base_model),
                keep_last=section.keep_last,
                manifest=section.manifest,
                background=section.async_save,
                extra_weights=objects.get("extra_weights"),
                shard_size=section.shard_size,
            )
        )


def finish(
    section: SavingSection, pending: ckpt_tools.training.PendingCheckpoint, keep: Collection[str] = ()
) -> str:
    """Collective: wait for the pending checkpoint's writes on every rank, commit it, move `last`, apply
    --keep_last, which spares the step names in `keep` (those a push reads). Returns the step directory."""
    with _one_line(section):
        return str(pending.finish(keep))


@contextlib.contextmanager
def _one_line(section: SavingSection) -> Iterator[None]:
    try:
        yield
    except ckpt_tools.training.SaveFailedError as exc:
        raise CheckpointSaveError(
            f"{exc}; `last` still names the newest complete checkpoint: fix the cause and resume with "
            f"--resume=true --output_dir={os.path.abspath(section.output_dir)}"
        ) from None
