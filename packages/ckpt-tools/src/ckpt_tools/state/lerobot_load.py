"""A LeRobot run's step as the start of a run here: LeRobot main's sharded checkpoints continued on
any topology (docs/resume.md, "Continuing a LeRobot run").

LeRobot keeps what a resume needs in its own layout, and each part is read as LeRobot's resume reads
it:
- `training_step.json` (`format.meta.LeRobotStep`) with `train_config.json`'s `checkpoint_format`,
  `accelerator.mixed_precision` and `seed` becomes a `TrainingStep`, so `plan_resume` judges the
  current run against it like one of ours (topology and batch changes named, sample offset kept);
- `rng_state.safetensors` holds rank 0's generators only: every rank takes them, as LeRobot's own
  resume does;
- the weights (`pytorch_model_fsdp_0/` or `model.safetensors`) and the sharded optimizer
  (`optimizer_0/`, keyed `optimizer.state.<fqn>.<exp_avg|exp_avg_sq|step>`) are under LeRobot's
  FQNs, which the caller's `rename` (the policy's own mapping of LeRobot's state dict) turns into
  this model's; they are read whole and handed to torch's full-state-dict load, which shards them
  onto whatever topology this run has;
- `scheduler_state.json`, when LeRobot's run had a scheduler.
What cannot carry over, LeRobot's sampler order, is the trainer's to name (its sampler differs).
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful

from ckpt_tools.catalog import LEROBOT, catalog
from ckpt_tools.errors import CorruptCheckpointError, NotACheckpointError, ResumeRefusedError
from ckpt_tools.files import storage
from ckpt_tools.files.locate import resolve_model_dir
from ckpt_tools.format import layout
from ckpt_tools.format.meta import LeRobotStep, Topology, TrainingStep
from ckpt_tools.format.untrusted import MAX_CONFIG_BYTES, check_like
from ckpt_tools.state.evaluation_load import load_model_state_dict
from ckpt_tools.tensors.tensor_io import read_dcp_full, read_safetensors

Rename = Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]
"""LeRobot's state dict (its FQNs) -> the model's (a policy's LeRobot adapter: `state_from_lerobot`)."""

_STATE_PREFIX = "optimizer.state."


def is_lerobot_checkpoint(step_dir: str | os.PathLike[str]) -> bool:
    """Whether a step directory (or `last`, a `pretrained_model/`) is in LeRobot's layout."""
    return catalog(step_dir).layout == LEROBOT


def check_lerobot_resumable(step_dir: str | os.PathLike[str]) -> None:
    """Refuse, in one line, a LeRobot step whose optimizer is not read here: 0.6.x's gathered
    `optimizer_state.safetensors` keys its moments by index, not by the parameters' names."""
    step, _ = _step_dirs(step_dir)
    shards = layout.join(step, layout.TRAINING_STATE_DIR, layout.OPTIMIZER_DCP_DIR)
    if not storage.exists(layout.join(shards, layout.DCP_METADATA)):
        raise ResumeRefusedError(
            f"{step} was written by LeRobot without {layout.OPTIMIZER_DCP_DIR}/ (a 0.6.x or non-sharded run): "
            "only the sharded optimizer of LeRobot main's parallel engine (--checkpoint_format=dcp or "
            "safetensors_dcp) is read here; start a new run from its weights with --policy.path"
        )


def read_lerobot_training_step(step_dir: str | os.PathLike[str]) -> TrainingStep:
    """LeRobot's `training_step.json` and `train_config.json` as the `TrainingStep` a resume plans
    from. 0.6.x's `num_processes` had no `parallelism`: its ranks were data-parallel replicas (DDP)."""
    step, model_dir = _step_dirs(step_dir)
    source = layout.join(step, layout.TRAINING_STATE_DIR, layout.TRAINING_STEP)
    lerobot = LeRobotStep.from_dict(storage.read_json_object(source), source)
    config = storage.read_json_object(layout.join(model_dir, layout.TRAIN_CONFIG), MAX_CONFIG_BYTES)
    accelerator = config.get("accelerator") or {}
    seed = config.get("seed")
    return TrainingStep(
        step=lerobot.step,
        dp_world_size=lerobot.dp_world_size,
        batch_size=lerobot.batch_size,
        grad_accum_steps=lerobot.grad_accum_steps,
        mixed_precision=str(accelerator.get("mixed_precision") or "no"),
        topology=lerobot.parallelism or Topology(dp_replicate=lerobot.dp_world_size),
        checkpoint_format=str(config.get("checkpoint_format") or "safetensors"),
        sampler=lerobot.sampler,
        seed=seed if isinstance(seed, int) and not isinstance(seed, bool) else None,
    )


def load_lerobot_rng_state(step_dir: str | os.PathLike[str]) -> None:
    """Restore python's, numpy's and torch's CPU generators (and CUDA's, when saved and present) from
    LeRobot's `rng_state.safetensors`, as LeRobot's `load_rng_state` does; reads the file, no
    collective. LeRobot saves rank 0's state only, and every rank of its resume loads it."""
    step, _ = _step_dirs(step_dir)
    path = layout.join(step, layout.TRAINING_STATE_DIR, layout.RNG_STATE)
    tensors, _ = read_safetensors(path)
    try:
        random.setstate(
            (int(tensors["py_rng_version"].item()), tuple(tensors["py_rng_state"].tolist()), None)
        )
        np.random.set_state(
            (
                "MT19937",
                tensors["np_rng_state_values"].numpy(),
                int(tensors["np_rng_state_index"].item()),
                int(tensors["np_rng_has_gauss"].item()),
                float(tensors["np_rng_cached_gaussian"].item()),
            )
        )
        torch.set_rng_state(tensors["torch_rng_state"])
        if torch.cuda.is_available() and "torch_cuda_rng_state" in tensors:
            torch.cuda.set_rng_state(tensors["torch_cuda_rng_state"])
    except (KeyError, ValueError, TypeError, RuntimeError, OverflowError) as exc:
        raise CorruptCheckpointError(
            f"{path}: LeRobot's RNG state does not load ({' '.join(str(exc).split())[:200]}); the file is "
            "damaged: resume from another step"
        ) from None


def load_lerobot_training_state(
    step_dir: str | os.PathLike[str],
    *,
    model: nn.Module,
    rename: Rename,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Stateful | None = None,
) -> None:
    """Collective on a sharded model: LeRobot's weights, AdamW moments and step counts (renamed by
    `rename`) and its scheduler state into the prepared model, optimizer and scheduler, on this run's
    topology. The optimizer keeps this run's param groups (their hyperparameters are LeRobot's
    config's, read as flags); only its per-parameter state comes from the step."""
    step, _ = _step_dirs(step_dir)
    state_dir = layout.join(step, layout.TRAINING_STATE_DIR)
    full = StateDictOptions(full_state_dict=True)
    weights: dict[str, Any] = rename(load_model_state_dict(step))
    set_model_state_dict(model, weights, options=full)
    if optimizer is not None:
        live = get_optimizer_state_dict(model, optimizer, options=full)
        state = _renamed_optimizer_state(state_dir, rename)
        trained = {name for name, p in model.named_parameters() if p.requires_grad}
        missing = sorted(trained - state.keys())
        if missing:
            raise CorruptCheckpointError(
                f"{state_dir}: LeRobot's optimizer holds no state for {len(missing)} of this model's "
                f"trained parameters (first: {missing[0]}); resume with the policy it was trained with"
            )
        loaded: dict[str, Any] = {"state": state, "param_groups": live["param_groups"]}
        set_optimizer_state_dict(model, optimizer, loaded, options=full)
    scheduler_file = layout.join(state_dir, layout.SCHEDULER_STATE)
    if scheduler is not None and storage.exists(scheduler_file):
        saved = storage.read_json_object(scheduler_file, MAX_CONFIG_BYTES)
        check_like(saved, scheduler.state_dict(), scheduler_file)
        scheduler.load_state_dict(saved)


def _renamed_optimizer_state(state_dir: str, rename: Rename) -> dict[str, dict[str, torch.Tensor]]:
    """LeRobot's `optimizer_0/` as `{fqn: {exp_avg, exp_avg_sq, step}}` under the model's names. A
    moment is renamed as the weight it belongs to is (one fused tensor may become three); a step count,
    a scalar, is renamed as a tensor of its weight's shape filled with it, so it follows the same
    split."""
    check_lerobot_resumable(layout.parent(state_dir))
    shards = layout.join(state_dir, layout.OPTIMIZER_DCP_DIR)
    by_key: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in read_dcp_full(shards).items():
        if name.startswith(_STATE_PREFIX):  # the param groups are this run's
            fqn, _, key = name.removeprefix(_STATE_PREFIX).rpartition(".")
            by_key.setdefault(key, {})[fqn] = tensor
    moments = {key: rename(values) for key, values in by_key.items() if key != "step"}
    steps = by_key.get("step", {})
    shaped = rename({fqn: torch.full_like(by_key["exp_avg"][fqn], float(v)) for fqn, v in steps.items()})
    dtype = next(iter(steps.values())).dtype if steps else torch.float32
    state: dict[str, dict[str, torch.Tensor]] = {}
    for key, values in moments.items():
        for fqn, value in values.items():
            state.setdefault(fqn, {})[key] = value.clone()
    for fqn, filled in shaped.items():
        state.setdefault(fqn, {})["step"] = filled.flatten()[0].clone().to(dtype).reshape(())
    return state


def _step_dirs(step_dir: str | os.PathLike[str]) -> tuple[str, str]:
    step, model_dir = resolve_model_dir(os.fspath(step_dir))
    if step is None:
        raise NotACheckpointError(f"{os.fspath(step_dir)} has no training_state/; pass a step directory")
    return step, model_dir
