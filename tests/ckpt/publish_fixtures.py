"""Hand-built model and step directories for the publishing tests.

Files are written with safetensors' own writer and plain JSON under layout.py's names, so the
publisher meets files it did not write itself. Tensors are tiny; numpy keeps torch out of these tests.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from ckpt_tools import layout

POLICY_TYPE = "act"
DATASET = "lerobot/pusht"
STEP = 10


def tensors(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"encoder.weight": rng.standard_normal((7, 5), dtype=np.float32), "head.bias": np.arange(3.0)}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2))


def make_step_dir(root: Path, *, weights: str = "single", with_dcp: bool = True) -> Path:
    """`root/checkpoints/000010` of a 2x2 HSDP run: weights are "single", "sharded", "adapter",
    "dcp_only" (stand-in shard files) or "none"; training state, DCP shards and optimizer state sit
    beside them as a real run leaves them."""
    step_dir = root / layout.CHECKPOINTS_DIR / layout.step_dir_name(STEP)
    model = step_dir / layout.PRETRAINED_MODEL_DIR
    state = step_dir / layout.TRAINING_STATE_DIR
    model.mkdir(parents=True)
    state.mkdir()
    _json(model / layout.POLICY_CONFIG, {"type": POLICY_TYPE, "license": "apache-2.0", "dim_model": 8})
    _json(
        model / layout.TRAIN_CONFIG,
        {"policy": {"type": POLICY_TYPE}, "dataset": {"repo_id": DATASET}, "steps": 100, "batch_size": 2},
    )
    _json(model / layout.processor_config_name(layout.PREPROCESSOR), {"steps": [{"name": "normalize"}]})
    save_file(tensors(1), str(model / layout.processor_step_name(layout.PREPROCESSOR, 0)))
    _json(model / layout.processor_config_name(layout.POSTPROCESSOR), {"steps": []})
    _write_weights(model, weights)
    if with_dcp or weights == "dcp_only":
        dcp = model / layout.MODEL_DCP_DIR
        dcp.mkdir()
        (dcp / layout.DCP_METADATA).write_bytes(b"metadata")
        (dcp / f"__0_0{layout.DCP_SHARD_SUFFIX}").write_bytes(b"\0shard")
        (state / layout.OPTIMIZER_DCP_DIR).mkdir()
        (state / layout.OPTIMIZER_DCP_DIR / f"__0_0{layout.DCP_SHARD_SUFFIX}").write_bytes(b"\0optim")
    save_file(tensors(2), str(state / layout.RNG_STATE))
    _json(state / layout.SCHEDULER_STATE, {"last_epoch": STEP})
    _json(
        state / layout.TRAINING_STEP,
        {
            "format_version": 1,
            "step": STEP,
            "dp_world_size": 4,
            "batch_size": 2,
            "grad_accum_steps": 3,
            "mixed_precision": "bf16",
            "topology": {"dp_replicate": 2, "dp_shard": 2, "cp_size": 1, "tp_size": 1},
            "checkpoint_format": "safetensors_dcp",
            "sampler": {"epoch": 0, "offset": 80},
            "seed": 1000,
            "peft": weights == "adapter",
        },
    )
    return step_dir


def _write_weights(model: Path, weights: str) -> None:
    if weights == "single":
        save_file(tensors(0), str(model / layout.MODEL_SAFETENSORS))
    elif weights == "sharded":
        weight_map = {}
        for index, (name, value) in enumerate(tensors(0).items(), start=1):
            shard = layout.sharded_model_name(index, 2)
            save_file({name: value}, str(model / shard))
            weight_map[name] = shard
        _json(model / layout.MODEL_INDEX, {"metadata": {"total_size": 0}, "weight_map": weight_map})
    elif weights == "adapter":
        save_file(tensors(3), str(model / layout.ADAPTER_SAFETENSORS))
        _json(model / layout.ADAPTER_CONFIG, {"peft_type": "LORA", "r": 4})


SINGLE_FILES = [
    "README.md",
    layout.POLICY_CONFIG,
    layout.MODEL_SAFETENSORS,
    layout.processor_config_name(layout.POSTPROCESSOR),
    layout.processor_config_name(layout.PREPROCESSOR),
    layout.processor_step_name(layout.PREPROCESSOR, 0),
    layout.TRAIN_CONFIG,
]


def snapshot(root: Path) -> dict[str, str]:
    """Every file under `root` with its sha256: a publish must leave this unchanged."""
    return {str(p.relative_to(root)): sha256(p) for p in sorted(root.rglob("*")) if p.is_file()}


def save_real_dcp(model_dir: Path) -> dict[str, np.ndarray]:
    """Write `pytorch_model_fsdp_0/` with torch's own DCP writer (single process); return the tensors."""
    import torch
    import torch.distributed.checkpoint as dcp

    state = tensors(5)
    dcp.save(
        {name: torch.from_numpy(value) for name, value in state.items()},
        checkpoint_id=str(model_dir / layout.MODEL_DCP_DIR),
    )
    return state
