"""The start banner: what a run is about to do, in the lines the main rank prints before step 1
(the topology and processes, the effective batch, the schedule of saves, the EMA, the FSDP units, the
data the policy reads)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainer.config.dataset import Dataset
from trainer.config.sections import RunPlan
from trainer.data.pipeline.sampler import sampled_frames
from trainer.distributed.wrap import WrapPlan, describe_parameters
from trainer.engine.run import RunData

if TYPE_CHECKING:
    import torch
    from accelerate import Accelerator


def _processes(accelerator: Accelerator) -> str:
    """ "1 process" or "4 processes, FSDP": accelerate's distributed type only when there is one."""
    count, kind = accelerator.num_processes, accelerator.distributed_type.value
    processes = "1 process" if count == 1 else f"{count} processes"
    return processes if kind == "NO" else f"{processes}, {kind}"


def data_banner(plan: RunPlan, run_data: RunData) -> list[str]:
    """What the policy reads: the frames, the observation features in their concatenation order."""

    def frames(dataset: Dataset) -> str:
        return f"{len(dataset)} frames in {len(dataset.episode_bounds())} episodes"

    data, config, val = run_data.dataset, plan.data.dataset, run_data.val_dataset
    held_out = f"; held out for val_loss: {frames(val)}" if val is not None else ""
    return [
        *config.banner(),
        *getattr(data, "notes", []),
        f"data {config.type}: {frames(data)}{held_out}; observation = "
        f"{' + '.join(data.input_features)} ({data.obs_dim} values), action {data.action_dim} values",
    ]


def run_banner(
    plan: RunPlan, data: RunData, wrap_plan: WrapPlan | None, accelerator: Accelerator, model: torch.nn.Module
) -> list[str]:
    """The whole banner: the run's lines, the optimizer and schedule, the data, the parameters."""
    return [
        *_run_lines(plan, data.dataset, wrap_plan, accelerator),
        plan.optimization.described,
        *data_banner(plan, data),
        describe_parameters(model),
    ]


def _run_lines(
    plan: RunPlan, dataset: Dataset, wrap_plan: WrapPlan | None, accelerator: Accelerator
) -> list[str]:
    """The topology and processes, the effective batch, the schedule of saves, the EMA, the FSDP units."""
    topology, saving, optimization = plan.parallelism.topology, plan.saving, plan.optimization
    accum, batch_size, mixed_precision = (
        plan.loop.grad_accum_steps,
        saving.batch_size,
        saving.mixed_precision,
    )
    effective = batch_size * topology.dp_world_size * accum
    lines = [
        f"job {plan.tracking.job_name}: {plan.policy.policy.type} policy, {topology.describe()} "
        f"({_processes(accelerator)}, device {accelerator.device})",
        f"effective batch size {effective} = batch_size {batch_size} x dp_world_size "
        f"{topology.dp_world_size} x grad_accum {accum}",
        f"{plan.loop.steps} loop steps, {plan.loop.steps // accum} optimizer updates, dataset "
        f"{len(dataset)} samples, mixed precision {mixed_precision}, checkpoints "
        f"{saving.checkpoint_format} every {saving.save_freq} steps in {saving.output_dir}",
    ]
    dropped = plan.policy.policy.drop_n_last_frames
    if dropped:
        drawn = len(sampled_frames(dataset.episode_bounds(), dropped))
        lines.append(
            f"--policy.drop_n_last_frames={dropped}: {drawn} of the {len(dataset)} frames are drawn as "
            "samples (never an episode's last ones; they are still read around the others)"
        )
    ema = optimization.ema
    if ema.enable:
        warmup = f"warmup inv_gamma={ema.inv_gamma} power={ema.power:.4g}" if ema.power else "no warmup"
        lines.append(
            f"EMA of the trained parameters on every rank in their own sharding: decay up to "
            f"{min(ema.decay, ema.max_decay)} ({warmup}; the first {ema.update_after_step + 1} update(s) "
            f"copy the weights), saved in every checkpoint; end-of-run rollouts score "
            f"{'the EMA' if ema.use_for_eval else 'the trained weights'}"
        )
    if wrap_plan is not None:
        mpp = plan.parallelism.accelerator.fsdp.mixed_precision_policy
        effective_policy = (
            f"param_dtype={mpp.param_dtype} reduce_dtype={mpp.effective_reduce_dtype()} "
            f"output_dtype={mpp.output_dtype}"
            if mpp.is_set
            else f"from --accelerator.mixed_precision={mixed_precision}"
        )
        lines.append(f"FSDP units {wrap_plan.describe()}; mixed precision policy {effective_policy}")
    return lines
