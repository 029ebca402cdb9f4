"""The run plan: every decision a run takes from its parsed config, taken once, before anything is built.

Parsing (cli/parse.py) turns argv and config files into a `TrainConfig`. `resolve_plan` then decides
what the launch, the saved run and the data imply: the parallelism that fits this world size (and the
topology it resolves to), the checkpoint format that topology can write, the FSDP reduce dtype torch will
really use, the PEFT form of `--accelerator.fsdp.ignored_modules`, the tracker run ids, the optimizer and
schedule (the policy's training preset or the flags), and the dataset's observation features and
feature sizes. Each decision is a function that returns a value; the resolved
config is a new object (the caller's is deep-copied first and never edited), and nothing edits it after
this step, so `train_config.json` (`saving.saved_config`) is the encoded plan and records exactly
what the run did.

The one decision taken later is the resume step: which checkpoint `last` names can only be agreed once
the process group is up (the main rank decides and broadcasts, resume.before_prepare).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace

import torch

from ckpt_tools import Topology
from trainer.config.accelerator import AcceleratorConfig
from trainer.config.dataset import Dataset
from trainer.config.optim import OptimizerConfig, SchedulerConfig
from trainer.config.parallelism import ParallelismConfig
from trainer.config.train import TrainConfig
from trainer.data.pipeline.renamed import load_renamed
from trainer.distributed.factory import check_accelerate_env
from trainer.distributed.topology import check_checkpoint_format, resolve_topology
from trainer.engine.checkpoint import publishing, saving
from trainer.engine.peft_policy import ignored_modules_pattern
from trainer.errors import ConfigError
from trainer.policies import PolicyConfig
from trainer.policies.base import fit_to_data
from trainer.reporting.trackers import check_trackers, resolve_run_ids


@dataclass(frozen=True)
class RunPlan:
    """What a run is, decided once: the resolved config (what train_config.json records), the launch's
    world size and topology, the banner's line on the optimizer and schedule (and where they came
    from), the lines to print after the banner, and the data read to decide the policy's features
    (loaded once, used for training)."""

    config: TrainConfig
    world_size: int
    topology: Topology
    optimization: str
    notes: tuple[str, ...]
    dataset: Dataset
    val_dataset: Dataset | None


def resolve_plan(config: TrainConfig, world_size: int) -> RunPlan:
    """Every rank resolves the same plan from the same config. Refuses, before any data is read, what
    cannot run (a layout or format that does not fit, trackers or a Hub publish that would fail, an
    output_dir holding another run)."""
    config = copy.deepcopy(config)  # nothing the plan holds is reachable from the caller's object
    parallelism, layout_note = settle_parallelism(config, world_size)
    topology = resolve_topology(parallelism, world_size)
    checkpoint_format, format_note = settle_checkpoint_format(config, topology)
    wandb, trackio = resolve_run_ids(config)
    optimizer, scheduler, source = resolve_optimization(config)
    config = config.derive(
        optimizer=optimizer,
        scheduler=scheduler,
        parallelism=parallelism,
        checkpoint_format=checkpoint_format,
        accelerator=resolve_accelerator(config, topology),
        wandb=wandb,
        trackio=trackio,
    )
    publish_note = _check_startable(config, topology)
    dataset, val_dataset, rename_note = load_renamed(
        config.dataset, config.rename_map, config.policy.input_features, held_out=True
    )
    config = config.derive(policy=resolve_policy_features(config.policy, dataset))
    notes = tuple(note for note in (layout_note, format_note, publish_note, rename_note) if note)
    optimization = f"{source}: {optimizer.describe()}, {scheduler.describe()}"
    return RunPlan(config, world_size, topology, optimization, notes, dataset, val_dataset)


def resolve_optimization(config: TrainConfig) -> tuple[OptimizerConfig, SchedulerConfig, str]:
    """The optimizer and schedule the run trains with, and where they came from (the banner's words).

    With --use_policy_training_preset=true (LeRobot's default) a new run takes the policy's preset
    (`get_optimizer_preset()`, `get_scheduler_preset()`), and a typed --optimizer.* / --scheduler.*
    flag is refused: LeRobot replaces those values with the preset without a word, here the command
    says which one it means. A resumed run keeps the optimizer and schedule its train_config.json
    records, as LeRobot's does, and refuses a --policy.* flag that would change the preset under it.
    With false, the --optimizer.* / --scheduler.* values (flags, a config file, the defaults) apply."""
    resuming = config.resume and config.config_path is not None
    if not config.use_policy_training_preset:
        source = "the resumed run's train_config.json" if resuming else "--optimizer.* and --scheduler.*"
        return config.optimizer, config.scheduler, f"{source} (--use_policy_training_preset=false)"
    name = f"{type(config.policy).__name__.removesuffix('Config')}'s preset"
    typed = sorted(flag for flag in config.flags_given if flag.startswith(("optimizer.", "scheduler.")))
    if typed:
        raise ConfigError(
            f"--{typed[0]} is refused while --use_policy_training_preset=true (the default) trains with "
            f"{name}: pass --use_policy_training_preset=false to choose the optimizer and schedule with "
            "--optimizer.* and --scheduler.*, or change the preset through the policy's fields "
            "(docs/training.md, 'Optimizer and schedule: training presets')"
        )
    optimizer, scheduler = config.policy.get_optimizer_preset(), config.policy.get_scheduler_preset()
    if not resuming:
        return optimizer, scheduler, name
    changed = (optimizer, scheduler) != (config.optimizer, config.scheduler)
    policy_flags = sorted(f"--{flag}" for flag in config.flags_given if flag.startswith("policy."))
    if changed and policy_flags:
        raise ConfigError(
            f"with {' '.join(policy_flags)}, {name} is {optimizer.describe()}, {scheduler.describe()}, but a "
            f"resumed run keeps the optimizer and schedule it started with ({config.optimizer.describe()}, "
            f"{config.scheduler.describe()}): drop the --policy.* flag that changes it, or start a new run"
        )
    return config.optimizer, config.scheduler, f"the resumed run's train_config.json ({name})"


def _check_startable(config: TrainConfig, topology: Topology) -> str | None:
    """The refusals that must come before any work; returns the publish warning, if any."""
    publish_note = publishing.check_publish_config(config)  # a repo_id that will not be used
    check_trackers(config)
    check_accelerate_env()
    check_policy_device(config.policy.device, torch.cuda.is_available())
    saving.check_fresh_output_dir(config)
    saving.check_async_save(config, topology)
    return publish_note


def check_policy_device(device: str | None, cuda: bool) -> None:
    """LeRobot's --policy.device, checked against the device this launch trains on (each rank's GPU
    when torch sees one, else the CPU): a disagreeing value is refused, never silently ignored."""
    launch = "cuda" if cuda else "cpu"
    if device in (None, "auto", launch):
        return
    why = (
        "torch sees a GPU (hide it with CUDA_VISIBLE_DEVICES= to train on cpu)"
        if cuda
        else "torch sees no GPU"
    )
    raise ConfigError(
        f"--policy.device={device} disagrees with this launch, which trains on {launch}: {why}; drop "
        f"--policy.device or set it to {launch} or auto"
    )


def settle_parallelism(config: TrainConfig, world_size: int) -> tuple[ParallelismConfig, str]:
    """A resumed run launched on a different number of processes, with no `--parallelism.*` flag typed,
    keeps the saved run's kind (sharded or replicated) over the new world: FSDP2 on every rank, or DDP.
    Returns the parallelism to run with and the line that says so ("" when the saved degrees fit or
    were chosen on the command line; an unfit typed layout is refused by resolve_topology)."""
    saved = config.parallelism
    typed = any(flag.startswith("parallelism.") for flag in config.flags_given)
    if not config.resume or typed:
        return saved, ""
    try:
        resolve_topology(saved, world_size)
        return saved, ""
    except ConfigError:
        pass
    settled = replace(saved, dp_replicate=1, dp_shard=-1 if saved.dp_shard != 1 else 1)
    topology = resolve_topology(settled, world_size)
    return settled, (
        f"the saved --parallelism.dp_replicate={saved.dp_replicate} --parallelism.dp_shard={saved.dp_shard} "
        f"does not fit {world_size} processes: this run is {topology.describe()} "
        "(pass --parallelism.* to choose another layout)"
    )


def settle_checkpoint_format(config: TrainConfig, topology: Topology) -> tuple[str, str]:
    """A DCP run resumed on DDP or one process saves `safetensors` from then on, when its DCP format
    came from the saved config rather than a flag. Returns the format and the line that says so ("" when
    nothing changed). An explicit DCP `--checkpoint_format` on a non-sharded run is refused."""
    saved = config.checkpoint_format
    from_saved_config = config.resume and "checkpoint_format" not in config.flags_given
    if from_saved_config and saved != "safetensors" and not topology.is_sharded:
        return "safetensors", (
            f"--checkpoint_format={saved} of the saved config needs a sharded run; this "
            f"{topology.describe()} run saves --checkpoint_format=safetensors"
        )
    check_checkpoint_format(saved, topology)
    return saved, ""


def resolve_accelerator(config: TrainConfig, topology: Topology) -> AcceleratorConfig:
    """The accelerator settings as the run applies them: the FSDP reduce dtype torch will use when it
    was left unset (its default changed in torch 2.15, so the file must say which one ran), and the
    ignored-modules regex in the form that also matches a PEFT model's module names."""
    fsdp = config.accelerator.fsdp
    mpp = fsdp.mixed_precision_policy
    if mpp.is_set:
        mpp = replace(mpp, reduce_dtype=mpp.effective_reduce_dtype())
    ignored = fsdp.ignored_modules
    if config.peft.enabled and topology.is_sharded:
        ignored = ignored_modules_pattern(ignored)
    fsdp = replace(fsdp, mixed_precision_policy=mpp, ignored_modules=ignored)
    return replace(config.accelerator, fsdp=fsdp)


def resolve_policy_features(policy: PolicyConfig, dataset: Dataset) -> PolicyConfig:
    """The policy config as the data shapes it (`policies.base.fit_to_data`: the features the dataset
    resolved, the sizes left at 0, a camera policy's frame shapes), so the saved config.json rebuilds
    the same policy without the data."""
    return fit_to_data(policy, dataset)
