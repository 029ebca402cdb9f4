"""A step of ours written as a step of LeRobot main's parallel engine, so that its `lerobot-train
--resume=true --config_path=<step>/pretrained_model/train_config.json` continues the run (the way
back of `lerobot_load.py`; docs/resume.md, "Continuing a run in LeRobot").

What LeRobot main's resume reads, in its names and forms:
- `pretrained_model/pytorch_model_fsdp_0/`: the weights as DCP, keyed `model.<fqn>` (accelerate's
  FSDP2 save of `{"model": state_dict}`), under LeRobot's FQNs;
- `training_state/optimizer_0/`: AdamW as DCP, `optimizer.state.<fqn>.{exp_avg,exp_avg_sq,step}` and
  `optimizer.param_groups.<i>.<key>` with `params` a list of FQNs (torch's name-keyed optimizer
  state dict, as accelerate saves it);
- `training_state/training_step.json`: `step`, `dp_world_size`, `batch_size`, `grad_accum_steps`,
  `parallelism` (LeRobot's degrees: `ring_degree` and `ulysses_degree`, no tensor parallel);
- `training_state/rng_state.safetensors`: rank 0's generators under LeRobot's keys (its resume gives
  them to every rank).
Renaming to LeRobot's FQNs is the caller's (a policy's LeRobot adapter); this module knows no policy.
Each DCP directory is written by this one process (`no_dist`): torch reshards it on LeRobot's load.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint import format_utils
from torch.distributed.checkpoint.planner import LoadPlanner
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict  # loads every saved key

from ckpt_tools.errors import CorruptCheckpointError, NotACheckpointError
from ckpt_tools.files import storage
from ckpt_tools.files.locate import resolve_model_dir
from ckpt_tools.format import layout
from ckpt_tools.format.meta import TrainingStep
from ckpt_tools.state.optim_codec import read_optimizer_safetensors
from ckpt_tools.state.rng import load_rng_state
from ckpt_tools.tensors.tensor_io import (
    dcp_reader,
    dcp_save,
    quiet_single_process,
    validate_dcp_metadata,
    write_safetensors,
)

OptimizerState = dict[str, dict[str, torch.Tensor]]
"""An optimizer's per-parameter state by parameter name: `{fqn: {exp_avg, exp_avg_sq, step}}`."""


def read_named_optimizer_state(step_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Our step's optimizer as torch's name-keyed state dict (`{"state": {fqn: {...}}, "param_groups":
    [...]}`, `params` as FQNs), whole, in this process: from `optimizer_0/` (a sharded run) or from
    `optimizer_state.safetensors` (a non-sharded one)."""
    step, _ = _step_dirs(step_dir)
    state_dir = layout.join(step, layout.TRAINING_STATE_DIR)
    shards = layout.join(state_dir, layout.OPTIMIZER_DCP_DIR)
    if not storage.exists(layout.join(shards, layout.DCP_METADATA)):
        return read_optimizer_safetensors(state_dir)
    validate_dcp_metadata(shards)
    osd: dict[str, Any] = {}
    with quiet_single_process():  # every entry, tensors and param groups, as `dcp_to_torch_save` does
        # torch's planner for "every saved key" (dcp_to_torch_save's), which torch neither re-exports nor types
        planner_class: type[LoadPlanner] = vars(format_utils)["_EmptyStateDictLoadPlanner"]
        planner = planner_class()
        _load_state_dict(osd, storage_reader=dcp_reader(shards), planner=planner, no_dist=True)
    if not isinstance(osd.get("state"), dict) or not isinstance(osd.get("param_groups"), list):
        raise CorruptCheckpointError(f"{shards} holds no optimizer state dict (state, param_groups)")
    return osd


def write_lerobot_training_state(
    step_dir: str | os.PathLike[str],
    *,
    source_step: str | os.PathLike[str],
    weights: Mapping[str, torch.Tensor],
    optimizer_state: OptimizerState,
    param_groups: list[dict[str, Any]],
    training_step: TrainingStep,
) -> list[str]:
    """Write LeRobot main's sharded state into `step_dir` (its `pretrained_model/` holds the configs
    already): `weights` and `optimizer_state` under LeRobot's FQNs, `param_groups` with FQN `params`,
    `training_step` (ours, written as LeRobot's), and the RNG of `source_step` (our step: its rank 0's generators). Returns the
    paths written, relative to `step_dir`."""
    step = os.fspath(step_dir)
    model_dcp = layout.join(layout.PRETRAINED_MODEL_DIR, layout.MODEL_DCP_DIR)
    optimizer_dcp = layout.join(layout.TRAINING_STATE_DIR, layout.OPTIMIZER_DCP_DIR)
    step_file = layout.join(layout.TRAINING_STATE_DIR, layout.TRAINING_STEP)
    rng_file = layout.join(layout.TRAINING_STATE_DIR, layout.RNG_STATE)
    storage.makedirs(layout.join(step, layout.TRAINING_STATE_DIR))
    dcp_save({"model": dict(weights)}, layout.join(step, model_dcp), None, False)
    osd = {"state": optimizer_state, "param_groups": param_groups}
    dcp_save({"optimizer": osd}, layout.join(step, optimizer_dcp), None, False)
    storage.write_json(layout.join(step, step_file), lerobot_step_json(training_step))
    write_safetensors(layout.join(step, rng_file), _lerobot_rng(source_step))
    return [model_dcp, optimizer_dcp, step_file, rng_file]


def lerobot_step_json(step: TrainingStep) -> dict[str, Any]:
    """Our `TrainingStep` as LeRobot main's `training_step.json` (`format.meta.LeRobotStep` reads it
    back): the same loop step and batch semantics; its context-parallel degree is `ring_degree` x
    `ulysses_degree` (ours, `cp_size`, is written as the ring's)."""
    topology = step.topology
    return {
        "step": step.step,
        "dp_world_size": step.dp_world_size,
        "batch_size": step.batch_size,
        "grad_accum_steps": step.grad_accum_steps,
        "parallelism": {
            "dp_replicate": topology.dp_replicate,
            "dp_shard": topology.dp_shard,
            "ring_degree": topology.cp_size,
            "ulysses_degree": 1,
        },
    }


def _lerobot_rng(source_step: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Rank 0's generators of our step under LeRobot's keys (`serialize_rng_state`'s), the reverse of
    `lerobot_load.load_lerobot_rng_state`. The generators are set from the step to read them in
    LeRobot's form, then put back as they were."""
    before = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    try:
        load_rng_state(source_step, 0, 1)
        version, words, _ = random.getstate()  # python's cached gaussian: LeRobot does not save it
        _, keys, position, has_gauss, cached = np.random.get_state()
        tensors = {
            "py_rng_version": torch.tensor([version], dtype=torch.int64),
            "py_rng_state": torch.tensor(words, dtype=torch.int64),
            "np_rng_state_values": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "np_rng_state_index": torch.tensor([position], dtype=torch.int64),
            "np_rng_has_gauss": torch.tensor([has_gauss], dtype=torch.int64),
            "np_rng_cached_gaussian": torch.tensor([cached], dtype=torch.float32),
            "torch_rng_state": torch.get_rng_state(),
        }
    finally:
        random.setstate(before[0])
        np.random.set_state(before[1])
        torch.set_rng_state(before[2])
    return tensors


def _step_dirs(step_dir: str | os.PathLike[str]) -> tuple[str, str]:
    step, model_dir = resolve_model_dir(os.fspath(step_dir))
    if step is None:
        raise NotACheckpointError(f"{os.fspath(step_dir)} has no training_state/; pass a step directory")
    return step, model_dir
