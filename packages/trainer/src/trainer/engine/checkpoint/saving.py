"""Checkpoints through ckpt-tools only: this module builds the inputs, ckpt_tools writes every file."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Collection, Iterator
from typing import TYPE_CHECKING, Any, TypedDict

import torch

import ckpt_tools
from ckpt_tools import SamplerPosition, Topology, TrainingStep, layout
from trainer.config.train import TrainConfig, encode_config
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
    ema: NotRequired[dict[str, torch.Tensor] | None]  # the --ema.enable shadow: a weight set of its own


def checkpoints_dir(output_dir: str) -> str:
    return layout.join(output_dir, layout.CHECKPOINTS_DIR)


def check_fresh_output_dir(config: TrainConfig) -> None:
    """A new run must not mix its checkpoints with an older run's."""
    if config.resume:
        return
    try:
        holds = ckpt_tools.latest_step_dir(config.output_dir) is not None
    except ckpt_tools.CheckpointError as exc:  # a broken `last` is still an older run's
        raise ConfigError(
            f"--output_dir={config.output_dir} holds a broken checkpoint pointer: {exc}"
        ) from None
    if holds:
        raise ConfigError(
            f"--output_dir={config.output_dir} already holds checkpoints: choose another --output_dir, "
            "or continue that run with --resume=true"
        )


def check_async_save(config: TrainConfig, topology: Topology) -> None:
    """--async_save writes DCP shards in the background: only a sharded run has them."""
    if config.async_save and not topology.is_sharded:
        raise ConfigError(
            f"--async_save=true writes a sharded run's DCP shards in the background, and this "
            f"{topology.describe()} run has none: shard it (--parallelism.dp_shard=N) or drop --async_save"
        )


def saved_config(config: TrainConfig) -> dict[str, Any]:
    """train_config.json: the run's config with its absolute output_dir (parse_config resolves it) and
    `resume` stored false, so the file alone reproduces the run from its start; continuing the run is
    what `--resume=true` asks for."""
    return {**encode_config(config), "resume": False}


def training_step(
    config: TrainConfig, topology: Topology, step: int, position: tuple[int, int]
) -> TrainingStep:
    return TrainingStep(
        step=step,
        dp_world_size=topology.dp_world_size,
        batch_size=config.batch_size,
        grad_accum_steps=config.accelerator.gradient_accumulation.steps,
        mixed_precision=config.accelerator.mixed_precision,
        topology=topology,
        checkpoint_format=config.checkpoint_format,
        sampler=SamplerPosition(epoch=position[0], offset=position[1]),
        seed=config.seed,
        peft=config.peft.enabled,
    )


def save(
    config: TrainConfig, state: TrainingStep, *, keep: Collection[str] = (), **objects: Unpack[SavedObjects]
) -> str:
    """Collective: call on all ranks. `start` then `finish`: the step committed; returns its directory."""
    return finish(config, start(config, state, **objects), keep)


def start(
    config: TrainConfig,
    state: TrainingStep,
    **objects: Unpack[SavedObjects],
) -> ckpt_tools.PendingCheckpoint:
    """Collective: call on all ranks. Writes the step (its DCP shards in the background with
    --async_save) and returns the pending checkpoint that `finish` commits."""
    processors = {
        layout.PREPROCESSOR: ckpt_tools.ProcessorState(*objects["preprocessor"].state()),
        layout.POSTPROCESSOR: ckpt_tools.ProcessorState(*objects["postprocessor"].state()),
    }
    with _one_line(config):
        return ckpt_tools.start_checkpoint(
            checkpoints_dir(config.output_dir),
            state,
            model=objects["model"],
            optimizer=objects["optimizer"],
            policy_config=config.policy.to_dict(),
            train_config=saved_config(config),
            processors=processors,
            scheduler=objects["scheduler"],
            scaler=objects["scaler"],
            adapter_config=adapter_config(objects["model"], config),
            keep_last=config.keep_last,
            manifest=config.checkpoint_manifest,
            background=config.async_save,
            ema=objects.get("ema"),
            shard_size=config.save_shard_size,
        )


def finish(config: TrainConfig, pending: ckpt_tools.PendingCheckpoint, keep: Collection[str] = ()) -> str:
    """Collective: wait for the pending checkpoint's writes on every rank, commit it, move `last`, apply
    --keep_last, which spares the step names in `keep` (those a push reads). Returns the step directory."""
    with _one_line(config):
        return str(pending.finish(keep))


@contextlib.contextmanager
def _one_line(config: TrainConfig) -> Iterator[None]:
    try:
        yield
    except ckpt_tools.SaveFailedError as exc:
        raise CheckpointSaveError(
            f"{exc}; `last` still names the newest complete checkpoint: fix the cause and resume with "
            f"--resume=true --output_dir={os.path.abspath(config.output_dir)}"
        ) from None
