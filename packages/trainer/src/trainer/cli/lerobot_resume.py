"""`--resume=true --config_path=<LeRobot step>/pretrained_model/train_config.json`: a LeRobot run's
saved config (LeRobot's `TrainPipelineConfig` schema, which is not ours) read as the LeRobot flags
that started it, so the run continues here (docs/resume.md, "Continuing a LeRobot run").

The policy comes from the step's own `config.json` (`--policy.path=<step>/pretrained_model`, read by
the policy's LeRobot adapter, as a fine-tune reads it); the settings that define the run are read from
`train_config.json` as the flags of the same name (`CARRIED`), through `settle_lerobot_flags` like
typed ones; the flags given on the command line come after them and win (another topology, another
`--output_dir`). LeRobot's other settings (W&B, evaluation, Hub jobs) are this run's own flags.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

import ckpt_tools
from ckpt_tools import layout
from trainer.cli.lerobot_flags import settle_lerobot_flags
from trainer.errors import ConfigError

# train_config.json entries read as flags: a top-level field, or a section's fields (all of them: None)
CARRIED: dict[str, tuple[str, ...] | None] = {
    "output_dir": None,
    "job_name": None,
    "seed": None,
    "num_workers": None,
    "batch_size": None,
    "steps": None,
    "log_freq": None,
    "save_freq": None,
    "checkpoint_format": None,
    "use_policy_training_preset": None,
    "optimizer": None,
    "scheduler": None,
    "rename_map": None,
    "dataset": ("repo_id", "root", "episodes", "revision", "video_backend"),
    "parallelism": ("dp_replicate", "dp_shard"),
    "accelerator": ("mixed_precision", "gradient_accumulation"),
}

NO_SCHEDULER = ["--scheduler.type=constant", "--scheduler.warmup_steps=0"]


def lerobot_config(config_path: str | None) -> dict[str, Any] | None:
    """The saved config when `config_path` is the `train_config.json` of a LeRobot step, else None."""
    if config_path is None or layout.name(config_path) != layout.TRAIN_CONFIG:
        return None
    model_dir = layout.parent(config_path)
    try:
        if not ckpt_tools.training.is_lerobot_checkpoint(model_dir):
            return None
        return ckpt_tools.read_config_json(config_path)
    except ckpt_tools.CheckpointError:
        return None  # not a step, or damaged: the ordinary parse names the problem


def lerobot_run_flags(config_path: str, saved: dict[str, Any], resume: bool) -> list[str]:
    """The flags a LeRobot step's `train_config.json` (`saved`) stands for, `--resume=true` included."""
    model_dir = layout.parent(config_path)
    if not resume:
        raise ConfigError(
            f"--config_path={config_path} is a LeRobot run's train_config.json: continue that run with "
            f"--resume=true, or start a new run from its weights with --policy.path={model_dir}"
        )
    try:
        ckpt_tools.training.check_lerobot_resumable(model_dir)
    except ckpt_tools.CheckpointError as exc:
        raise ConfigError(f"cannot resume from --config_path={config_path}: {exc}") from None
    if (saved.get("dataset") or {}).get("image_transforms", {}).get("enable"):
        raise ConfigError(
            f"--config_path={config_path}: the LeRobot run augments its frames (dataset.image_transforms), "
            "which are not read from its config: give them as --dataset.image_transforms.* flags"
        )
    flags: list[str] = []
    for name, fields in CARRIED.items():
        value = saved.get(name)
        if isinstance(value, dict) and fields is not None:
            value = {field: value[field] for field in fields if field in value}
        _flatten(name, value, flags)
    if saved.get("scheduler") is None:  # LeRobot's "no scheduler": the optimizer's rate throughout
        flags += NO_SCHEDULER
    return [*settle_lerobot_flags(flags), f"--policy.path={model_dir}", "--resume=true"]


def _flatten(prefix: str, value: Any, out: list[str]) -> None:
    """`--a.b=<JSON>` for each leaf under `prefix`; a null leaf is left to this trainer's default (LeRobot
    writes null for what it leaves unset), an empty map is written as one."""
    if isinstance(value, dict) and value and prefix != "rename_map":
        for key, item in value.items():
            _flatten(f"{prefix}.{key}", item, out)
    elif value is not None:
        out.append(f"--{prefix}={_flag_value(value)}")


def _flag_value(value: Any) -> str:
    """A value as a flag spells it: a string as it is, unless the parser would read it as something
    else (LeRobot's `"no"` precision is YAML's false), then quoted; anything else as JSON."""
    if isinstance(value, str) and yaml.safe_load(value) == value:
        return value
    return json.dumps(value)
