"""The start banner: what a run is about to do, in the lines the main rank prints before step 1
(the topology and processes, the effective batch, the schedule of saves, the EMA, the FSDP units, the
data the policy reads)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import ckpt_tools
from trainer.config.dataset import Dataset
from trainer.config.train import TrainConfig
from trainer.distributed.wrap import WrapPlan
from trainer.engine.run import Run

if TYPE_CHECKING:
    from accelerate import Accelerator


def _processes(accelerator: Accelerator) -> str:
    """ "1 process" or "4 processes, FSDP": accelerate's distributed type only when there is one."""
    count, kind = accelerator.num_processes, accelerator.distributed_type.value
    processes = "1 process" if count == 1 else f"{count} processes"
    return processes if kind == "NO" else f"{processes}, {kind}"


def data_banner(run: Run) -> list[str]:
    """What the policy reads: the frames, the observation features in their concatenation order."""

    def frames(dataset: Dataset) -> str:
        return f"{len(dataset)} frames in {len(dataset.episode_bounds())} episodes"

    held_out = f"; held out for val_loss: {frames(run.val_dataset)}" if run.val_dataset is not None else ""
    return [
        *run.config.dataset.banner(),
        *getattr(run.dataset, "notes", []),
        f"data {run.config.dataset.type}: {frames(run.dataset)}{held_out}; observation = "
        f"{' + '.join(run.dataset.input_features)} ({run.dataset.obs_dim} values), action {run.dataset.action_dim} values",
    ]


def run_banner(
    config: TrainConfig,
    topology: ckpt_tools.Topology,
    wrap_plan: WrapPlan | None,
    accelerator: Accelerator,
    samples: int,
) -> list[str]:
    accum = config.accelerator.gradient_accumulation.steps
    effective = config.batch_size * topology.dp_world_size * accum
    lines = [
        f"job {config.job_name}: {config.policy.type} policy, {topology.describe()} "
        f"({_processes(accelerator)}, device {accelerator.device})",
        f"effective batch size {effective} = batch_size {config.batch_size} x dp_world_size "
        f"{topology.dp_world_size} x grad_accum {accum}",
        f"{config.steps} loop steps, {config.steps // accum} optimizer updates, dataset {samples} samples, "
        f"mixed precision {config.accelerator.mixed_precision}, checkpoints {config.checkpoint_format} "
        f"every {config.save_freq} steps in {config.output_dir}",
    ]
    if config.ema.enable:
        ema = config.ema
        warmup = f"warmup inv_gamma={ema.inv_gamma} power={ema.power:.4g}" if ema.power else "no warmup"
        lines.append(
            f"EMA of the trained parameters on every rank in their own sharding: decay up to "
            f"{min(ema.decay, ema.max_decay)} ({warmup}; the first {ema.update_after_step + 1} update(s) "
            f"copy the weights), saved in every checkpoint; end-of-run rollouts score "
            f"{'the EMA' if ema.use_for_eval else 'the trained weights'}"
        )
    if wrap_plan is not None:
        mpp = config.accelerator.fsdp.mixed_precision_policy
        effective_policy = (
            f"param_dtype={mpp.param_dtype} reduce_dtype={mpp.effective_reduce_dtype()} "
            f"output_dtype={mpp.output_dtype}"
            if mpp.is_set
            else f"from --accelerator.mixed_precision={config.accelerator.mixed_precision}"
        )
        lines.append(f"FSDP units {wrap_plan.describe()}; mixed precision policy {effective_policy}")
    return lines
