"""What a run builds before its first step, in order: the policy (on the meta device where it can be),
the processors, the accelerator and the process group, the run lock, the data feed, the optimizer and
schedule, then the two resume phases around `prepare()` (and between them, what the policy computes
from the data's tasks: `Policy.prepare_tasks`). Each part takes its own section of the plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import ckpt_tools
from trainer.config.dataset import Dataset, EmbodiedDataset
from trainer.config.policy import PolicyConfig
from trainer.config.sections import RunPlan
from trainer.data.pipeline.feed import DataFeed
from trainer.data.pipeline.processors import Processor, build_processors, embodied_processors
from trainer.distributed.factory import build_accelerator, prepare
from trainer.distributed.fault_tolerance import data_split, join_replica_group
from trainer.distributed.heal_state import GroupState
from trainer.distributed.runlock import RunLock
from trainer.distributed.wrap import WrapPlan
from trainer.engine import build as model_build
from trainer.engine.checkpoint import resume
from trainer.engine.ema import Ema
from trainer.engine.host_memory import hold_mmap_threshold
from trainer.engine.run import Run, RunData, extra_weights
from trainer.errors import USER_ERRORS, ConfigError
from trainer.policies.common.base import optimizer_params


@dataclass(frozen=True)
class Started:
    """The built run, its FSDP wrap plan (None unsharded) and where it resumed from."""

    run: Run
    wrap_plan: WrapPlan | None
    resume_point: resume.ResumePoint


def start_run(plan: RunPlan, data: RunData, lock: RunLock, notes: list[str]) -> Started:
    """Collective. Policy, accelerator, the run lock, optimizer; the two resume phases around
    `prepare()`. A stale lock taken over adds its warning to `notes`."""
    hold_mmap_threshold()  # before the build allocates: freed tensors leave the process
    dataset, section = data.dataset, plan.policy
    topology = plan.parallelism.topology
    # on the meta device where it can be; --policy.path weights, --peft adapters, unit transforms
    built = model_build.build(section, topology.is_sharded, dataset.obs_dim, dataset.action_dim, notes)
    policy, wrap_plan = built.policy, built.wrap_plan
    preprocessor, postprocessor = _processors(section.policy, dataset)
    accelerator = build_accelerator(plan.parallelism, wrap_plan)
    model_build.before_prepare(built, section, accelerator.device)  # the unsharded policy is real now
    # while the launcher's store is up (ranks it leaves behind still save), bounded like every collective
    ckpt_tools.training.prepare_save_groups(timedelta(seconds=plan.parallelism.collective_timeout_s))
    lock_note = ckpt_tools.training.main_decides(
        lock.acquire, error=ConfigError, expected=USER_ERRORS
    )  # before anything is written to output_dir
    if lock_note:
        notes.append(lock_note)
    data_world, data_rank = data_split(
        plan.fault_tolerance, topology.dp_world_size, accelerator.process_index
    )
    feed = DataFeed(
        plan.data,
        dataset,
        data.val_dataset,
        section.policy.frames,
        dp_world_size=data_world,
        rank=data_rank,
        device=accelerator.device,
        drop_last_frames=section.policy.drop_n_last_frames,
    )
    optimization = plan.optimization
    optimizer = optimization.optimizer.build(optimizer_params(policy, built.base))
    scheduler = optimization.scheduler.build(optimizer, optimization.steps)

    # ---- Resume, phase 1 (before prepare): restore the step, the RNG and the sampler position. ----
    resume_point = resume.before_prepare(
        plan.saving, topology, policy, feed.sampler, accelerator.process_index, accelerator.num_processes
    )

    model, optimizer, scheduler = prepare(accelerator, policy, optimizer, scheduler, wrap_plan)
    model_build.after_prepare(built, section, accelerator.device)  # a sharded policy's shards are real now
    if built.base.takes_tasks():
        built.base.prepare_tasks(_distinct_tasks(dataset, data.val_dataset), accelerator.device)

    # ---- Resume, phase 2 (after prepare): load model/optimizer/scheduler/EMA state (ckpt_tools). ----
    unwrapped = accelerator.unwrap_model(model)
    ema = Ema(optimization.ema, unwrapped) if optimization.ema.enable else None
    loaded = resume.after_prepare(
        resume_point,
        model=unwrapped,
        optimizer=optimizer,
        scheduler=scheduler,
        scaler=accelerator.scaler,
        extra_weights=extra_weights(ema),
    )
    if ema is not None and resume_point.step_dir is not None and "ema" not in loaded:
        ema = Ema(optimization.ema, unwrapped)  # from the resumed weights
        notes.append(f"{resume_point.step_dir} holds no EMA weights: the EMA starts from its weights")
    replicas = join_replica_group(
        plan.fault_tolerance,
        accelerator.process_index,
        accelerator.num_processes,
        GroupState(unwrapped, optimizer, scheduler, feed.sampler, extra_weights(ema)),
        plan.loop.grad_accum_steps,
    )
    start_step = replicas.join(resume_point.start_step)  # a fault-tolerant group may heal from a peer
    if start_step != resume_point.start_step:
        notes.append(f"healed from a live replica group: continuing after its step {start_step}")
    # accelerate counts accumulation windows from its own start: count them from step 0 instead, so a
    # resumed run's windows end where the uninterrupted run's do (docs/resume.md).
    accelerator.step = start_step
    run = Run(
        topology=topology,
        accelerator=accelerator,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        feed=feed,
        preprocessor=preprocessor,
        postprocessor=postprocessor,
        start_step=start_step,
        check_lock=lock.check,
        ema=ema,
        replicas=replicas,
    )
    return Started(run, wrap_plan, resume_point)


def _distinct_tasks(dataset: Dataset, val_dataset: Dataset | None) -> list[str]:
    """The task texts the run's batches can carry: the training data's, then the held-out data's."""
    held_out = val_dataset.distinct_tasks() if val_dataset is not None else []
    return list(dict.fromkeys([*dataset.distinct_tasks(), *held_out]))


def _processors(policy: PolicyConfig, dataset: Dataset) -> tuple[Processor, Processor]:
    """The run's pre/post-processors from the data's statistics as the policy maps them; for a mixture
    of robots that differ, one set per robot (embodiment), each item normalized by its own."""
    adapter = policy.lerobot_adapter()
    pipeline = None if adapter is None else adapter.pipeline(policy)
    if isinstance(dataset, EmbodiedDataset) and dataset.embodiments:
        stats = [policy.normalization_stats(s) for s in dataset.embodiment_stats()]
        return embodied_processors(stats, pipeline, dataset.embodiments)
    return build_processors(policy.normalization_stats(dataset.stats()), pipeline)
