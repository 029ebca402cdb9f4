"""`trainer export --lerobot_step`: a step of ours as a step of LeRobot main's parallel engine, which
its `lerobot-train --resume=true --config_path=<out>/pretrained_model/train_config.json` continues (the
way back of "Continuing a LeRobot run"; docs/resume.md, "Continuing a run in LeRobot").

Why a step and not only a model: a model directory (`export_lerobot`) starts a new LeRobot run; a
step carries the run itself, AdamW's moments and step counts, the data position and the generators.
The written step is what LeRobot main writes with `--checkpoint_format=safetensors_dcp`:
`pretrained_model/` as `export_lerobot` writes it (config.json, model.safetensors, the processors)
plus `train_config.json` (LeRobot main's `TrainPipelineConfig`) and `pytorch_model_fsdp_0/`, and
`training_state/` (`optimizer_0/`, `training_step.json`, `rng_state.safetensors`): ckpt_tools'
`write_lerobot_training_state`. The names are the policy adapter's (`state_to_lerobot`,
`tensors_to_lerobot`, `lerobot_param_groups`); a policy whose adapter has no optimizer form
(`lerobot_param_groups` None) is refused in one line: ACT has one.

The weights are the model's, never the EMA (a resume continues what the optimizer trained). A run
with a learning-rate schedule other than a constant rate is refused: LeRobot's schedulers keep
another state. LeRobot main keeps DCP steps for sharded runs alone and refuses to resume across the
sharded / non-sharded line, so only a step of a sharded run of ours (FSDP2, HSDP) is exported: its
non-sharded form (an optimizer keyed by index) is not written here.
"""

from __future__ import annotations

from typing import Any

import torch

import ckpt_tools
from ckpt_tools import layout, storage
from ckpt_tools.training import read_named_optimizer_state, write_lerobot_training_state
from trainer.errors import ConfigError
from trainer.evaluation.inference import load_policy
from trainer.evaluation.lerobot_export import export_lerobot, lerobot_adapter

CHECKPOINT_FORMAT = "safetensors_dcp"  # LeRobot main's name for DCP shards beside model.safetensors
# torch's AdamW hyperparameters as LeRobot's optimizer holds them (no `initial_lr`: no scheduler)
_GROUP_KEYS = (
    "lr", "betas", "eps", "weight_decay", "amsgrad", "maximize", "foreach", "capturable",
    "differentiable", "fused", "decoupled_weight_decay",
)  # fmt: skip


def export_lerobot_step(path: str, output_dir: str) -> list[str]:
    """Write our step at `path` (a step directory or `last`) into the new directory `output_dir` as
    LeRobot main's step; returns the paths written, relative to it."""
    try:
        saved = ckpt_tools.read_training_step(path)
        model_dir = ckpt_tools.open_checkpoint(path).model_dir
        train_config = ckpt_tools.read_config_json(layout.join(model_dir, layout.TRAIN_CONFIG))
        osd = read_named_optimizer_state(path)
    except ckpt_tools.CheckpointError as exc:
        raise ConfigError(f"--policy.path={path}: {exc}; give a step directory of a run") from None
    _check_schedule(train_config, path)
    if not saved.topology.is_sharded:
        raise ConfigError(
            f"{path} is a step of a non-sharded run ({saved.topology.describe()}): LeRobot main resumes its "
            "DCP steps only on a sharded run and refuses to cross from a non-sharded one; export a step of "
            "a run with --parallelism.dp_shard=2 or more"
        )
    loaded = load_policy(path, "cpu", "model")
    adapter = lerobot_adapter(loaded.config)
    weights = adapter.state_to_lerobot(loaded.config, loaded.policy)
    state = _lerobot_moments(adapter, loaded.config, osd["state"], path)
    groups = adapter.lerobot_param_groups(loaded.config, [name for name in weights if name in state])
    if groups is None:
        raise ConfigError(
            f"a {loaded.config.type} policy's optimizer has no LeRobot main form yet (its adapter has no "
            "lerobot_param_groups): export its weights alone with trainer export --policy.path"
        )
    hyper = {key: osd["param_groups"][0][key] for key in _GROUP_KEYS if key in osd["param_groups"][0]}
    param_groups = [{**hyper, **extra, "params": names} for names, extra in groups]
    out_model_dir = layout.join(output_dir, layout.PRETRAINED_MODEL_DIR)
    written = export_lerobot(path, out_model_dir, "model")
    storage.write_json(
        layout.join(out_model_dir, layout.TRAIN_CONFIG),
        lerobot_train_config(train_config, adapter.config_to_lerobot(loaded.config), saved),
    )
    state_files = write_lerobot_training_state(
        output_dir,
        source_step=path,
        weights={name: tensor.contiguous() for name, tensor in weights.items()},
        optimizer_state=state,
        param_groups=param_groups,
        training_step=saved,
    )
    model_files = [layout.join(layout.PRETRAINED_MODEL_DIR, name) for name in [*written, layout.TRAIN_CONFIG]]
    return [*model_files, *state_files]


def lerobot_train_config(
    ours: dict[str, Any], policy: dict[str, Any], saved: ckpt_tools.TrainingStep
) -> dict[str, Any]:
    """Our run's train_config.json as LeRobot main's `TrainPipelineConfig` (the fields a resume reads;
    LeRobot fills the others with its defaults): the dataset, the policy's LeRobot config, the loop's
    settings, AdamW, no scheduler, the topology, precision and accumulation."""
    dataset = ours["dataset"]
    topology = saved.topology
    return {
        "dataset": {
            key: dataset.get(key) for key in ("repo_id", "root", "episodes", "revision", "video_backend")
        },
        "env": None,
        "policy": {**policy, "push_to_hub": False},
        "output_dir": ours["output_dir"],
        "job_name": ours.get("job_name") or policy["type"],
        "resume": False,
        "seed": ours["seed"],
        "num_workers": ours["num_workers"],
        "batch_size": ours["batch_size"],
        "steps": ours["steps"],
        "env_eval_freq": 0,
        "log_freq": ours["log_freq"],
        "save_checkpoint": True,
        "save_freq": ours["save_freq"],
        "checkpoint_format": CHECKPOINT_FORMAT,
        "use_policy_training_preset": ours["use_policy_training_preset"],
        "optimizer": ours["optimizer"],
        "scheduler": None,
        "parallelism": {
            "dp_replicate": topology.dp_replicate,
            "dp_shard": topology.dp_shard,
            "context_parallel": {"ring_degree": topology.cp_size, "ulysses_degree": 1},
            "cfg_parallel": 1,
        },
        "accelerator": {
            "mixed_precision": saved.mixed_precision,
            "gradient_accumulation": {"steps": saved.grad_accum_steps},
        },
        "wandb": {"enable": False},
        "rename_map": ours.get("rename_map") or {},
        "checkpoint_path": None,
    }


def _lerobot_moments(
    adapter: Any, config: Any, state: dict[str, dict[str, torch.Tensor]], path: str
) -> dict[str, dict[str, torch.Tensor]]:
    """Our AdamW state under LeRobot's names: each moment renamed (and fused) as its weight is, the
    step count (one for every weight: AdamW steps them together) beside each."""
    steps = {float(entry["step"]) for entry in state.values() if "step" in entry}
    if len(steps) > 1:
        raise ConfigError(
            f"{path}: its optimizer's weights were stepped {len(steps)} different numbers of times; "
            "LeRobot's step keeps one count for all: export a step where every weight has been trained"
        )
    out: dict[str, dict[str, torch.Tensor]] = {}
    for key in ("exp_avg", "exp_avg_sq"):
        moments = {fqn: entry[key] for fqn, entry in state.items() if key in entry}
        for name, tensor in adapter.tensors_to_lerobot(config, moments).items():
            out.setdefault(name, {})[key] = tensor.contiguous()
    dtype = next(iter(state.values()))["step"].dtype if state else torch.float32
    count = torch.tensor(steps.pop() if steps else 0.0, dtype=dtype)
    for entry in out.values():
        entry["step"] = count.clone()
    return out


def _check_schedule(train_config: dict[str, Any], path: str) -> None:
    scheduler = train_config.get("scheduler") or {}
    if scheduler.get("type") != "constant" or scheduler.get("warmup_steps"):
        raise ConfigError(
            f"{path}: the run's learning rate follows a {scheduler.get('type')} schedule, whose state "
            "LeRobot's schedulers do not read: only a run at a constant rate (ACT's preset) continues in "
            "LeRobot main"
        )
