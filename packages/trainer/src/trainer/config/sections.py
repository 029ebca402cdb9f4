"""The run plan's sections: what each part of the engine reads of a run, and nothing more (plain values,
in config/ so that every layer can take its own).

`engine/plan.py` resolves a parsed `TrainConfig` into a `RunPlan` made of these frozen sections; past
that point the config itself is not seen. A component takes its own section (the checkpoint wing
`SavingSection`, the trackers `TrackingSection`, the policy build `PolicySection`, ...), so what it
depends on is written in its signature, and a new flag reaches only the section that uses it. A value
two components need (the loop's `steps`, the run's `seed`) sits in each section that reads it, copied
once by the plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ckpt_tools import Ranking
from ckpt_tools.training import Topology
from trainer.config.accelerator import AcceleratorConfig, UnitSettings
from trainer.config.dataset import DatasetConfig
from trainer.config.ema import EmaConfig
from trainer.config.fault_tolerance import FaultToleranceSection
from trainer.config.optim import OptimizerConfig, SchedulerConfig
from trainer.config.peft import PeftConfig
from trainer.config.policy import PolicyConfig
from trainer.config.tracking import TrackioConfig, WandbConfig


@dataclass(frozen=True)
class DataSection:
    """What the data feed reads: the dataset, the batch per rank, the workers that decode it."""

    dataset: DatasetConfig
    batch_size: int
    num_workers: int
    prefetch_factor: int
    persistent_workers: bool
    multiprocessing_context: str | None
    """The workers' start method (--dataloader_multiprocessing_context; None: the platform's)."""
    seed: int
    """Seeds the sample order (and the augmentation's draws)."""
    timeout_s: int
    """How long a batch may take before its worker is reported stalled (--collective_timeout_s)."""
    max_val_samples: int
    """Most held-out samples val_loss scores, split evenly across the held-out spans (LeRobot's
    --max_eval_samples; 0: all of them)."""


@dataclass(frozen=True)
class LoopSection:
    """What the training loop reads: how many steps, how they make an update, and when it logs and
    scores the held-out data."""

    steps: int
    grad_accum_steps: int
    """Loop steps (micro-batches) per optimizer update."""
    grad_clip_norm: float
    """The global gradient norm clipped to (<= 0: measured, not clipped)."""
    log_freq: int
    val_freq: int
    """Held-out val_loss every this many loop steps (--eval_freq or LeRobot's --eval_steps; 0: only at
    the end)."""
    val_batch_size: int
    """The held-out evaluation's batch per rank (--batch_size)."""


@dataclass(frozen=True)
class PolicySection:
    """What the policy build reads: the policy, its PEFT wrapping, the unit settings (the units FSDP
    and the unit transforms apply to, and how), the seed of its initial values."""

    policy: PolicyConfig
    peft: PeftConfig
    units: UnitSettings
    seed: int


@dataclass(frozen=True)
class ParallelismSection:
    """What the accelerator factory reads: the resolved topology and accelerate's settings."""

    topology: Topology
    accelerator: AcceleratorConfig
    collective_timeout_s: int


@dataclass(frozen=True)
class OptimizationSection:
    """The optimizer, the schedule over the loop's `steps`, the EMA, with the banner's line on where they
    came from (the policy's preset or the flags)."""

    optimizer: OptimizerConfig
    scheduler: SchedulerConfig
    steps: int
    ema: EmaConfig
    described: str


@dataclass(frozen=True)
class HubSection:
    """Where the run's model is published: at the end (--policy.push_to_hub) and while training
    (--save_checkpoint_to_hub)."""

    repo_id: str | None
    private: bool
    push_to_hub: bool
    save_checkpoint_to_hub: bool
    push_training_state: bool

    @property
    def publishes(self) -> bool:
        return self.push_to_hub or self.save_checkpoint_to_hub


@dataclass(frozen=True)
class SavingSection:
    """What the checkpoint wing (saves, resume, retention, publishing) reads, including the two files
    every step carries: the policy's config.json and the run's train_config.json."""

    output_dir: str
    checkpoint_format: str
    manifest: bool
    shard_size: str | None
    save_freq: int
    keep_last: int
    async_save: bool
    resume: bool
    config_path: str | None
    steps: int
    batch_size: int
    seed: int
    grad_accum_steps: int
    mixed_precision: str
    peft: bool
    base_model: str | None
    """The weights the run started from (--policy.path), recorded in a PEFT run's adapter_config.json."""
    policy_config: Mapping[str, Any]
    train_config: Mapping[str, Any]
    """The resolved config, encoded once: every step's train_config.json (saving.py stores `resume`
    false) and the run config the trackers record."""
    hub: HubSection
    eval_every: int = 0
    """Also save every this many steps, for the evaluator to score (--env_eval_freq; 0: no evaluator)."""
    ranking: Ranking | None = None
    """--keep_best: the K best steps by --best_metric survive --keep_last, `best` names the top one."""


@dataclass(frozen=True)
class TrackingSection:
    """What the metrics logger and the experiment trackers read."""

    job_name: str
    output_dir: str
    wandb: WandbConfig
    trackio: TrackioConfig
    wandb_mode: str
    """The W&B mode decided once by the plan (a typed flag, then W&B's environment, then the config)."""


@dataclass(frozen=True)
class EnvEvaluation:
    """The evaluator process beside the run (--env.type with --env_eval_freq; docs/evaluation.md): it
    reads its environment and --eval.* from the committed steps' train_config.json; the run launches
    it, logs its scores at their steps, and waits for the last one only with --eval.wait_at_end."""

    output_dir: str
    every: int
    """The steps it scores: multiples of --env_eval_freq, and the last one."""
    last_step: int
    wait_at_end: bool
    step_bound_s: float
    """The longest one step's evaluation may take (its batches of episodes, each within the time limit)."""
    allow_types: tuple[str, ...]
    """The module:Name environment id the run itself named, which the evaluator may import."""
    cpus: tuple[int, ...] = ()
    """--eval.cpus: the cores the evaluator is moved to as it starts (empty: the run's own)."""


@dataclass(frozen=True)
class EvaluationSection:
    """The end-of-run rollouts on the data's simulated task, and the evaluator beside the run."""

    rollout_episodes: int
    rollout_camera: bool
    use_ema: bool
    """Score the EMA weights (--ema.use_for_eval with --ema.enable)."""
    environment: EnvEvaluation | None = None
    """The evaluator of the run's checkpoints in --env.type (None without --env.type or with
    --env_eval_freq=0)."""


@dataclass(frozen=True)
class RunPlan:
    """What a run is, decided once: one section per part of the engine and the lines to print after the
    banner (the data it read to decide them travels beside it, engine/run.py's `RunData`)."""

    loop: LoopSection
    data: DataSection
    policy: PolicySection
    parallelism: ParallelismSection
    optimization: OptimizationSection
    saving: SavingSection
    tracking: TrackingSection
    evaluation: EvaluationSection
    notes: tuple[str, ...]
    fault_tolerance: FaultToleranceSection | None = None
    """The replica group's wiring with --fault_tolerance.enable (None: a run without torchft)."""
