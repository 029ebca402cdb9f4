"""The run plan: every decision a run takes from its parsed config, taken once, before anything is built.

Parsing (cli/parse.py) turns argv and config files into a `TrainConfig`; config/ checks each value.
`resolve_plan` then decides what the launch, the saved run and the data imply: the parallelism that fits
this world size (and the topology it resolves to), the checkpoint format that topology can write, the
FSDP reduce dtype torch will really use, the PEFT form of `--accelerator.fsdp.ignored_modules`, the
tracker run ids, the optimizer and schedule (the policy's training preset or the flags), and the
dataset's observation features and feature sizes. Each decision is a function that returns a value; the
caller's config is deep-copied first and never edited.

The result is a `RunPlan` of typed sections (config/sections.py), with the data it read beside it
(`RunData`: live datasets are no plan value), and the `TrainConfig` stops here:
each part of the engine takes only its own section. The resolved config is encoded here once
(`SavingSection.train_config`): train_config.json records exactly what the run did, and the trackers
record the same mapping as their run's config.

The one decision taken later is the resume step: which checkpoint `last` names can only be agreed once
the process group is up (the main rank decides and broadcasts, resume.before_prepare).
"""

from __future__ import annotations

import copy
import os
import random
from dataclasses import replace

import numpy as np
import torch

from ckpt_tools import Ranking, default_mode
from ckpt_tools.training import Topology
from trainer.config.accelerator import AcceleratorConfig
from trainer.config.dataset import Dataset
from trainer.config.environment import check_installed
from trainer.config.fault_tolerance import check_composition, group_dir, resolve_fault_tolerance
from trainer.config.optim import OptimizerConfig, SchedulerConfig
from trainer.config.parallelism import ParallelismConfig
from trainer.config.sections import (
    DataSection,
    EnvEvaluation,
    EvaluationSection,
    HubSection,
    LoopSection,
    OptimizationSection,
    ParallelismSection,
    PolicySection,
    RunPlan,
    SavingSection,
    TrackingSection,
)
from trainer.config.train import TrainConfig, encode_config
from trainer.data.pipeline.renamed import load_renamed
from trainer.distributed.factory import check_accelerate_env
from trainer.distributed.topology import check_checkpoint_format, launch_world_size, resolve_topology
from trainer.engine import loop
from trainer.engine.checkpoint import publishing, saving
from trainer.engine.peft_policy import ignored_modules_pattern
from trainer.engine.run import RunData
from trainer.errors import ConfigError
from trainer.policies import PolicyConfig
from trainer.policies.common.base import fit_to_data
from trainer.reporting.summary import RunSummary
from trainer.reporting.trackers import check_trackers, resolve_run_ids, wandb_mode


def train(config: TrainConfig) -> RunSummary:
    """Collective: call on all ranks. `trainer train`: seeds, resolves the run plan from `config` (which
    is never edited) and runs it (engine/loop.py); returns the summary."""
    seed_everything(config.seed)  # before the plan reads the data, so a dataset plug-in's draws repeat
    set_cudnn(config.cudnn_deterministic)
    return loop.train(*resolve_plan(config, launch_world_size()))


def seed_everything(seed: int) -> None:
    """The same seed on every rank: identical initial weights before DDP/FSDP take over."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def set_cudnn(deterministic: bool) -> None:
    """--cudnn_deterministic=true: cuDNN's deterministic kernels and no autotuning (LeRobot's flag);
    false leaves torch's settings as they are."""
    if deterministic:
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False


def resolve_plan(config: TrainConfig, world_size: int) -> tuple[RunPlan, RunData]:
    """Every rank resolves the same plan from the same config, and reads the data it decides the
    policy's features from (returned beside the plan, to train on). Refuses, before any data is read,
    what cannot run (a layout or format that does not fit, trackers or a Hub publish that would fail,
    an output_dir holding another run)."""
    config = copy.deepcopy(config)  # nothing the plan holds is reachable from the caller's object
    parallelism, layout_note = settle_parallelism(config, world_size)
    topology = resolve_topology(parallelism, world_size)
    check_composition(config.fault_tolerance, topology.dp_replicate, config.env_evaluates)
    fault_tolerance = resolve_fault_tolerance(config.fault_tolerance, os.environ, config.collective_timeout_s)
    checkpoint_format, format_note = settle_checkpoint_format(config, topology)
    batch_size, batch_note = settle_batch_size(config, topology.dp_world_size)
    wandb, trackio = resolve_run_ids(config.wandb, config.trackio, config.resume, config.run_name)
    optimizer, scheduler, source = resolve_optimization(config)
    config = config.derive(
        batch_size=batch_size,
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
        config.dataset,
        config.rename_map,
        config.policy.input_features,
        held_out=True,
        mixed_members=config.policy.takes_mixed_members,
        padded=config.policy.pads_mixed_members,
        resize=config.policy.frame_resize(),
    )
    config = config.derive(policy=resolve_policy_features(config.policy, dataset))
    policy_note = config.policy.data_note()
    remarks = (layout_note, format_note, batch_note, publish_note, rename_note, policy_note)
    notes = tuple(note for note in remarks if note)
    described = f"{source}: {optimizer.describe()}, {scheduler.describe()}"
    plan = RunPlan(
        loop=loop_section(config),
        data=data_section(config),
        policy=policy_section(config),
        parallelism=ParallelismSection(topology, config.accelerator, config.collective_timeout_s),
        optimization=OptimizationSection(optimizer, scheduler, config.steps, config.ema, described),
        saving=saving_section(config),
        tracking=tracking_section(config),
        evaluation=EvaluationSection(
            config.dataset.rollout_episodes,
            config.dataset.rollout_camera,
            config.ema.enable and config.ema.use_for_eval,
            env_evaluation(config),
        ),
        notes=notes,
        fault_tolerance=fault_tolerance,
    )
    return plan, RunData(dataset, val_dataset)


def loop_section(config: TrainConfig) -> LoopSection:
    """The training loop's section of a resolved config (its optimizer's clipping included)."""
    return LoopSection(
        steps=config.steps,
        grad_accum_steps=config.accelerator.gradient_accumulation.steps,
        grad_clip_norm=config.optimizer.grad_clip_norm,
        log_freq=config.log_freq,
        val_freq=config.val_freq,
        val_batch_size=config.batch_size,
    )


def data_section(config: TrainConfig) -> DataSection:
    """The data feed's section of a resolved config."""
    return DataSection(
        dataset=config.dataset,
        batch_size=config.batch_size,
        num_workers=config.num_workers,
        prefetch_factor=config.prefetch_factor,
        persistent_workers=config.persistent_workers,
        multiprocessing_context=config.dataloader_multiprocessing_context,
        seed=config.seed,
        timeout_s=config.collective_timeout_s,
        max_val_samples=config.max_eval_samples,
    )


def policy_section(config: TrainConfig) -> PolicySection:
    """The policy build's section of a resolved config."""
    return PolicySection(config.policy, config.peft, config.accelerator.unit_settings(), config.seed)


def saving_section(config: TrainConfig) -> SavingSection:
    """The checkpoint wing's section of a resolved config: the config encoded once here, for
    train_config.json and the trackers."""
    policy = config.policy
    return SavingSection(
        output_dir=config.output_dir,
        checkpoint_format=config.checkpoint_format,
        manifest=config.checkpoint_manifest,
        shard_size=config.save_shard_size,
        save_freq=config.save_freq,
        keep_last=config.keep_last,
        async_save=config.async_save,
        resume=config.resume,
        config_path=config.config_path,
        steps=config.steps,
        batch_size=config.batch_size,
        seed=config.seed,
        grad_accum_steps=config.accelerator.gradient_accumulation.steps,
        mixed_precision=config.accelerator.mixed_precision,
        peft=config.peft.enabled,
        base_model=policy.path,
        policy_config=policy.to_dict(),
        train_config=encode_config(config),
        hub=hub_section(config),
        eval_every=config.env_eval_freq if config.env_evaluates else 0,
        ranking=ranking(config),
    )


def env_evaluation(config: TrainConfig) -> EnvEvaluation | None:
    """The evaluator beside the run, when its checkpoints are scored in an environment while it trains."""
    if not config.env_evaluates or config.env is None:
        return None
    settings = config.eval
    batches = -(-settings.n_episodes // settings.environments())
    env = config.env
    cores = os.cpu_count() or 1
    missing = [cpu for cpu in settings.cpus or () if not 0 <= cpu < cores]
    if missing:
        raise ConfigError(
            f"--eval.cpus={settings.cpus}: this machine has no core {missing[0]} (cores 0-{cores - 1})"
        )
    return EnvEvaluation(
        output_dir=config.output_dir,
        every=config.env_eval_freq,
        last_step=config.steps,
        wait_at_end=settings.wait_at_end,
        step_bound_s=(batches + 1) * settings.episode_time_limit_s + EVALUATOR_START_S,  # + starting them
        allow_types=(env.gym_id,) if env.type == "gym" and env.package is not None else (),
        cpus=tuple(settings.cpus or ()),
    )


EVALUATOR_START_S = 120.0  # loading a checkpoint and starting the environments' processes, at most


def ranking(config: TrainConfig) -> Ranking | None:
    """--keep_best's ranking of the run's steps (None without --keep_best)."""
    if not config.keep_best:
        return None
    mode = config.best_mode or default_mode(config.best_metric)
    return Ranking(config.best_metric, mode, config.keep_best)


def hub_section(config: TrainConfig) -> HubSection:
    """Where the run publishes its model: the --policy.* Hub fields and the push flags."""
    policy = config.policy
    return HubSection(
        repo_id=policy.repo_id,
        private=policy.private,
        push_to_hub=policy.push_to_hub,
        save_checkpoint_to_hub=config.save_checkpoint_to_hub,
        push_training_state=config.push_training_state,
    )


def tracking_section(config: TrainConfig) -> TrackingSection:
    """The metrics logger's and the trackers' section of a resolved config."""
    return TrackingSection(
        job_name=config.run_name,
        output_dir=group_dir(config.output_dir, config.fault_tolerance),  # a replica group's own logs
        wandb=config.wandb,
        trackio=config.trackio,
        wandb_mode=run_wandb_mode(config),
    )


def run_wandb_mode(config: TrainConfig) -> str:
    """The W&B mode this run uses (`reporting.trackers.wandb_mode`: a typed flag wins)."""
    return wandb_mode(config.wandb.mode, "wandb.mode" in config.flags_given)


# a policy's optimizer_* field read with either optimizer: ACT's camera trunk's own learning rate
ALL_OPTIMIZERS = ("policy.optimizer_lr_backbone",)


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
        preset_fields = sorted(
            flag
            for flag in config.flags_given
            if flag.startswith(("policy.optimizer_", "policy.scheduler_")) and flag not in ALL_OPTIMIZERS
        )
        if preset_fields:
            raise ConfigError(
                f"--{preset_fields[0]} sets the policy's training preset, which --use_policy_training_preset=false "
                f"replaces with --optimizer.* and --scheduler.*: set the value there (e.g. --optimizer.lr), or "
                "drop --use_policy_training_preset=false to train with the preset"
            )
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
    publish_note = publishing.check_publish_config(hub_section(config))  # a repo_id that will not be used
    check_trackers(
        config.wandb, config.trackio, wandb_mode(config.wandb.mode, "wandb.mode" in config.flags_given)
    )
    check_accelerate_env()
    check_policy_device(config.policy.device, torch.cuda.is_available())
    saving.check_fresh_output_dir(config.output_dir, config.resume)
    if config.env is not None:
        check_installed(config.env)
    saving.check_async_save(config.async_save, topology)
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


def settle_batch_size(config: TrainConfig, dp_world_size: int) -> tuple[int, str]:
    """The per-rank batch of this launch: --batch_size, or with --global_batch_size=G, G over the
    data-parallel ranks, so a relaunch on another number of ranks (torchrun --nnodes=MIN:MAX repeats
    the same command) keeps the global batch, and a resume stays sample-exact. Returns the batch and the
    line that says what changed ("" when G divides). A G that does not divide trains the nearest global
    batch below it (at least one sample per rank) and says so: an elastic launch cannot choose its
    ranks, so refusing would end the run."""
    wanted = config.global_batch_size
    if not wanted:
        return config.batch_size, ""
    if "batch_size" in config.flags_given:
        raise ConfigError(
            f"--batch_size={config.batch_size} and --global_batch_size={wanted} both set the batch: keep "
            "--global_batch_size (each launch divides it over its data-parallel ranks) and drop --batch_size"
        )
    per_rank = max(1, wanted // dp_world_size)
    if per_rank * dp_world_size == wanted:
        return per_rank, ""
    return per_rank, (
        f"--global_batch_size={wanted} does not divide over {dp_world_size} data-parallel ranks: this run "
        f"trains {per_rank} x {dp_world_size} = {per_rank * dp_world_size} samples per step (a resume from a "
        f"step saved with {wanted} groups samples into other steps from there on)"
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
    """The policy config as the data shapes it (`policies.common.base.fit_to_data`: the features the dataset
    resolved, the sizes left at 0, a camera policy's frame shapes), so the saved config.json rebuilds
    the same policy without the data."""
    return fit_to_data(policy, dataset)
