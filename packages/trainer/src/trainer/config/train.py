"""The run's configuration: a tree of per-component configs whose field paths are the CLI flags.

`train_config.json` (saved with every checkpoint) is `encode(config)`, and parsing it back with no
other flag reproduces the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import draccus

import ckpt_tools
from trainer.config.accelerator import AcceleratorConfig
from trainer.config.dataset import DatasetConfig
from trainer.config.ema import EmaConfig
from trainer.config.environment import EnvConfig, EnvEvalConfig
from trainer.config.fault_tolerance import FaultToleranceConfig
from trainer.config.optim import AdamWConfig, CosineConfig, OptimizerConfig, SchedulerConfig
from trainer.config.parallelism import ParallelismConfig
from trainer.config.peft import PeftConfig
from trainer.config.policy import PolicyConfig
from trainer.config.registry import registered_default
from trainer.config.tracking import TrackioConfig, WandbConfig
from trainer.errors import ConfigError


@dataclass
class TrainConfig:
    """`trainer train`: everything a run needs, and nothing read from elsewhere."""

    policy: PolicyConfig = field(
        default_factory=registered_default(PolicyConfig, "act_state", "trainer.policies")
    )
    dataset: DatasetConfig = field(
        default_factory=registered_default(DatasetConfig, "pendulum", "trainer.data")
    )
    use_policy_training_preset: bool = True
    """Train with the policy's own optimizer and schedule (LeRobot's flag and default; docs/training.md
    lists each policy's preset): --optimizer.* and --scheduler.* are refused while it is true; false
    takes them from those flags. A train_config.json written before this flag existed reads as false."""
    optimizer: OptimizerConfig = field(default_factory=AdamWConfig)
    scheduler: SchedulerConfig = field(default_factory=CosineConfig)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    accelerator: AcceleratorConfig = field(default_factory=AcceleratorConfig)
    peft: PeftConfig = field(default_factory=PeftConfig)
    ema: EmaConfig = field(default_factory=EmaConfig)
    fault_tolerance: FaultToleranceConfig = field(default_factory=FaultToleranceConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    trackio: TrackioConfig = field(default_factory=TrackioConfig)
    rename_map: dict[str, str] = field(default_factory=dict)
    """Dataset observation feature -> the name the policy reads it as (a JSON object, LeRobot's flag),
    e.g. '{"observation.images.top": "observation.images.front"}'; applied to the features the run
    reads, and recorded in train_config.json with the renamed names in the policy's config.json."""
    save_checkpoint_to_hub: bool = False
    """Push every committed checkpoint's model to the Hub repo --policy.repo_id in the background while
    training goes on: one commit per step, tagged `step-<step>` (docs/publishing.md)."""
    push_training_state: bool = False
    """With --save_checkpoint_to_hub: push each step's training_state/ too (optimizer, RNG, sampler)."""
    checkpoint_format: str = "safetensors"
    """safetensors (gathered weights), dcp (sharded weights) or safetensors_dcp (both); sharded runs only
    for the last two (a resumed run's saved dcp format becomes safetensors on a non-sharded run)."""
    checkpoint_manifest: bool = True
    """Write each checkpoint's manifest.json (every file's size and sha256, hashed while writing) for
    `ckpt verify --deep`; false saves the hashing time and the in-memory copy of the gathered weights."""
    save_shard_size: str | None = None
    """Write the gathered model weights as Hugging Face style shards of at most this size (5GB, 500MiB)
    with model.safetensors.index.json, split as huggingface_hub splits; unset: one model.safetensors."""
    batch_size: int = 32
    """Samples per rank per loop step."""
    global_batch_size: int = 0
    """Samples per loop step over all data-parallel ranks; 0 (the default): --batch_size per rank. Set,
    each launch takes it over its own ranks (--batch_size = this / data-parallel ranks), so an elastic
    relaunch on fewer nodes, repeating the same command, keeps the global batch (docs/resume.md)."""
    num_workers: int = 4
    """DataLoader worker processes per rank that decode camera frames ahead of the loop (0 decodes in
    the training process; data without cameras is always gathered in the training process)."""
    prefetch_factor: int = 2
    """Batches each data loader worker decodes ahead (LeRobot's default is 4)."""
    persistent_workers: bool = True
    """Keep the data loader workers alive between iterators (the run reads one iterator, so its
    workers live for the whole run either way; LeRobot's flag)."""
    dataloader_multiprocessing_context: str | None = None
    """How data loader workers start: fork, spawn or forkserver (LeRobot's flag; its default is spawn);
    unset: Python's platform default (fork on Linux), which the video readers are safe under."""
    cudnn_deterministic: bool = False
    """Deterministic cuDNN kernels (torch.backends.cudnn.deterministic, benchmark off) from the start
    of the run, for reproducible convolutions at some speed (LeRobot's flag); false leaves torch's
    defaults."""
    steps: int = 500
    """Loop steps (micro-batches), not optimizer updates."""
    save_freq: int = 250
    """Save a checkpoint every this many loop steps (and always at the end)."""
    log_freq: int = 50
    """Log reduced metrics every this many loop steps."""
    eval_freq: int = 0
    """Log val_loss on the held-out --dataset.val_episodes (or --dataset.eval_split) every this many
    loop steps (and at the end); 0: only at the end."""
    eval_steps: int = 0
    """LeRobot's name for --eval_freq (the two must agree when both are set); it needs held-out data
    (--dataset.eval_split or --dataset.val_episodes), as in LeRobot."""
    max_eval_samples: int = 0
    """Most held-out frames each val_loss scores, the first ones of each mixture member's held-out
    episodes, split evenly across the members (LeRobot splits across tasks); 0: every held-out frame."""
    env: EnvConfig | None = None
    """The environment the run's checkpoints are scored in (--env.type=pusht|aloha|pendulum|gym, LeRobot's
    flag), by an evaluator process beside the training ranks (docs/evaluation.md); unset: none."""
    env_eval_freq: int = 20_000
    """With --env.type: save a checkpoint every this many loop steps and score it in the environment
    (and the last step's), while training goes on; 0: no evaluation during the run (LeRobot's flag and
    default)."""
    eval: EnvEvalConfig = field(default_factory=EnvEvalConfig)
    keep_best: int = 0
    """Keep the K best-scored checkpoints by --best_metric through --keep_last's pruning, and point
    checkpoints/best at the best one (0: no ranking)."""
    best_metric: str = "avg_sum_reward"
    """The figure --keep_best ranks by: one an environment reports (avg_sum_reward, avg_max_reward,
    pc_success) or val_loss."""
    best_mode: str | None = None
    """max (higher is better) or min; unset: min for a loss, max otherwise."""
    seed: int = 1000
    """Seeds the policy's initialization, dropout and the sample order."""
    output_dir: str = "outputs/train"
    """Run directory: checkpoints/, metrics.jsonl, loss_curve.png."""
    job_name: str | None = None
    """Name shown in the banner, the metrics and the trackers' run; unset: the policy type, as
    lerobot-train names a run without --env.type."""
    resume: bool = False
    """Continue from the checkpoint --config_path names, else from output_dir's latest one (a fresh start
    before the first save); docs/resume.md."""
    keep_last: int = 0
    """Keep only the K newest checkpoints on disk (0 keeps all); never deletes the one `last` names."""
    async_save: bool = False
    """Write a sharded run's DCP shards in the background (torch DCP's async save) while training goes on;
    the step is committed and `last` moved once every rank's write has finished."""
    collective_timeout_s: int = 300
    """Seconds a collective (a save's barrier, a metric reduction) waits for the other ranks before every
    waiting rank stops with one error line: bounds the hang when a rank fails or stalls (torch's own
    default is 30 minutes)."""

    def __post_init__(self) -> None:
        # Not dataclass fields (so neither flags nor train_config.json entries): cli/parse.py sets
        # them from the command line. `config_path` is the `--config_path` file (draccus reserves the
        # name for its own flag), which resume follows to its checkpoint; `flags_given` are the dotted
        # names typed as flags, so a value that came from a saved config can be told from a chosen one.
        self.config_path: str | None = None
        self.flags_given: frozenset[str] = frozenset()
        self._check_hub_pushes()
        renamed = list(self.rename_map.values())
        if len(set(renamed)) != len(renamed):
            raise ConfigError(f"--rename_map gives two features the same name: {self.rename_map}")
        if self.keep_last < 0:
            raise ConfigError(f"--keep_last must be >= 0 (0 keeps every checkpoint), got {self.keep_last}")
        if self.checkpoint_format not in {member.value for member in ckpt_tools.CheckpointFormat}:
            raise ConfigError(
                f"--checkpoint_format={self.checkpoint_format!r} is not one of {ckpt_tools.CheckpointFormat.names()}"
            )
        if self.save_shard_size is not None:
            try:
                ckpt_tools.parse_size(self.save_shard_size, "--save_shard_size")
            except ckpt_tools.UsageError as exc:
                raise ConfigError(str(exc)) from None
        if self.num_workers < 0:
            raise ConfigError(
                f"--num_workers must be >= 0 (0 decodes in the training process), got {self.num_workers}"
            )
        for name in (
            "eval_freq",
            "eval_steps",
            "max_eval_samples",
            "env_eval_freq",
            "keep_best",
            "global_batch_size",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{name} must be >= 0, got {getattr(self, name)}")
        self._check_lerobot_eval_steps()
        self._check_keep_best()
        self._check_multiprocessing_context()
        for name in (
            "batch_size",
            "steps",
            "save_freq",
            "log_freq",
            "collective_timeout_s",
            "prefetch_factor",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name} must be >= 1, got {getattr(self, name)}")
        self._check_saves_end_windows()

    def _check_hub_pushes(self) -> None:
        repo_id = self.policy.repo_id
        if self.push_training_state and not self.save_checkpoint_to_hub:
            raise ConfigError(
                "--push_training_state=true applies to the pushes of --save_checkpoint_to_hub=true: add it, "
                "or drop --push_training_state"
            )
        if self.save_checkpoint_to_hub and repo_id is None:
            raise ConfigError(
                "--save_checkpoint_to_hub=true needs the Hub repo: add --policy.repo_id=namespace/name"
            )
        if self.save_checkpoint_to_hub and repo_id is not None and ckpt_tools.is_fsspec_target(repo_id):
            raise ConfigError(
                f"--save_checkpoint_to_hub=true pushes to a Hub repo, and --policy.repo_id={repo_id} is a path or "
                "URL: to keep checkpoints in a bucket, set --output_dir to it (checkpoints are written there)"
            )

    def _check_lerobot_eval_steps(self) -> None:
        """LeRobot's --eval_steps is --eval_freq under its name: both set must agree, and like LeRobot's
        it needs held-out frames to score."""
        if not self.eval_steps:
            return
        if self.eval_freq and self.eval_freq != self.eval_steps:
            raise ConfigError(
                f"--eval_steps={self.eval_steps} (LeRobot's name for --eval_freq) disagrees with "
                f"--eval_freq={self.eval_freq}: set one"
            )
        if not (getattr(self.dataset, "eval_split", 0.0) or getattr(self.dataset, "val_episodes", None)):
            raise ConfigError(
                f"--eval_steps={self.eval_steps} scores held-out episodes, and this run holds none out: add "
                "--dataset.eval_split=0.1 (or --dataset.val_episodes=[...]), or drop --eval_steps"
            )

    def _check_keep_best(self) -> None:
        """--keep_best ranks by a figure some step will have: an environment's, scored at the
        checkpoints --env_eval_freq asks for, or val_loss, computed at every checkpoint."""
        if self.best_mode not in (None, "max", "min"):
            raise ConfigError(f"--best_mode must be max or min (or unset), got {self.best_mode!r}")
        if not self.keep_best:
            return
        if self.best_metric == "val_loss":
            saves = [self.save_freq, *([self.env_eval_freq] if self.env_evaluates else [])]
            if not self.val_freq or any(period % self.val_freq for period in saves):
                raise ConfigError(
                    f"--keep_best={self.keep_best} --best_metric=val_loss ranks checkpoints by their val_loss: "
                    f"set --eval_freq to a divisor of --save_freq={self.save_freq} (and of --env_eval_freq), "
                    "with held-out episodes (--dataset.eval_split or --dataset.val_episodes)"
                )
        elif not self.env_evaluates:
            raise ConfigError(
                f"--keep_best={self.keep_best} --best_metric={self.best_metric} ranks checkpoints by an environment's "
                "figure: add --env.type=... with --env_eval_freq > 0, or rank by --best_metric=val_loss"
            )

    @property
    def env_evaluates(self) -> bool:
        """Whether the run's checkpoints are scored in an environment while it trains."""
        return self.env is not None and self.env_eval_freq > 0

    @property
    def run_name(self) -> str:
        """--job_name, else LeRobot's default: `<env>_<policy>` with --env.type, else the policy type."""
        if self.job_name:
            return self.job_name
        return f"{self.env.type}_{self.policy.type}" if self.env is not None else self.policy.type

    @property
    def val_freq(self) -> int:
        """How often val_loss is logged: --eval_freq, or LeRobot's --eval_steps."""
        return self.eval_freq or self.eval_steps

    def _check_multiprocessing_context(self) -> None:
        import multiprocessing

        context = self.dataloader_multiprocessing_context
        if context is not None and context not in multiprocessing.get_all_start_methods():
            raise ConfigError(
                f"--dataloader_multiprocessing_context={context!r} is not one of "
                f"{', '.join(multiprocessing.get_all_start_methods())} (or null for the platform's default)"
            )

    def derive(self, **changes: Any) -> TrainConfig:
        """A new config with `changes` applied (dataclasses.replace), carrying the parse-time
        `config_path` and `flags_given`, which __post_init__ resets: how the run plan resolves values
        without editing the parsed config."""
        derived = replace(self, **changes)
        derived.config_path, derived.flags_given = self.config_path, self.flags_given
        return derived

    def _check_saves_end_windows(self) -> None:
        """A checkpoint holds no accumulated gradients, so every save must end an accumulation window:
        one inside a window would resume without the window's earlier micro-batches (docs/resume.md)."""
        accum = self.accelerator.gradient_accumulation.steps
        flag = f"--accelerator.gradient_accumulation.steps={accum}"
        if self.save_freq < self.steps and self.save_freq % accum:
            raise ConfigError(
                f"--save_freq={self.save_freq} is not a multiple of {flag}: a checkpoint inside an "
                f"accumulation window cannot resume exactly; use {_nearest_multiples('save_freq', self.save_freq, accum)}"
            )
        if self.steps % accum:
            raise ConfigError(
                f"--steps={self.steps} is not a multiple of {flag}: the last micro-batches would never "
                f"update the weights and the final checkpoint would sit inside a window; use "
                f"{_nearest_multiples('steps', self.steps, accum)}"
            )


def _nearest_multiples(name: str, value: int, accum: int) -> str:
    """The fix a refusal offers: the next multiple of `accum`, and the previous one when it is >= 1."""
    lower = value - value % accum
    upper = lower + accum
    return f"--{name}={upper}" + (f" (or --{name}={lower})" if lower else "")


def encode_config(config: TrainConfig) -> dict[str, Any]:
    """The JSON-ready dict of a config (train_config.json is `engine/checkpoint/saving.py: saved_config`)."""
    return draccus.encode(config)
