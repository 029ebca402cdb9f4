"""Every rank's random number generator state (python, numpy, torch CPU and CUDA) in one file,
`training_state/rng_state.safetensors`, so a resumed run draws the numbers it would have drawn."""

from __future__ import annotations

import hashlib
import json
import os
import random
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ckpt_tools.errors import CorruptCheckpointError, NotACheckpointError
from ckpt_tools.files.digest import Recorder
from ckpt_tools.files.locate import resolve_model_dir
from ckpt_tools.format import layout
from ckpt_tools.tensors.tensor_io import read_safetensors, write_safetensors

RngSnapshot = tuple[dict[str, torch.Tensor], dict[str, str]]  # one rank's tensors and metadata


def save_rng_state(
    step_dir: str | os.PathLike[str],
    rank: int,
    world_size: int,
    *,
    process_group: dist.ProcessGroup | None = None,
    recorder: Recorder | None = None,
) -> None:
    """Collective when world_size > 1: gather every rank's python, numpy, torch CPU (+ CUDA) RNG
    state to rank 0, which writes `training_state/rng_state.safetensors` (recorded for the step's
    manifest when a `recorder` is given). A collective save takes `rng_snapshot` and `write_rng_state`
    apart instead, to carry the snapshots on a gather it makes anyway.
    """
    mine = rng_snapshot(rank)
    if world_size > 1:
        gathered: list[Any] | None = [None] * world_size if rank == 0 else None
        dist.gather_object(mine, gathered, group=process_group, group_dst=0)
    else:
        gathered = [mine]
    if rank == 0 and gathered is not None:
        write_rng_state(step_dir, gathered, recorder)


def write_rng_state(
    step_dir: str | os.PathLike[str], snapshots: list[RngSnapshot], recorder: Recorder | None = None
) -> None:
    """Write every rank's `rng_snapshot` (in rank order) as `training_state/rng_state.safetensors`.

    Keys are `rank<r>/python`, `rank<r>/numpy`, `rank<r>/torch`, `rank<r>/cuda/<device>`; the scalar
    parts of the python and numpy states, and `world_size`, are in the file's metadata.
    """
    tensors: dict[str, torch.Tensor] = {}
    metadata = {"world_size": str(len(snapshots))}
    for snapshot_tensors, snapshot_meta in snapshots:
        tensors.update(snapshot_tensors)
        metadata.update(snapshot_meta)
    path = layout.join(os.fspath(step_dir), layout.TRAINING_STATE_DIR, layout.RNG_STATE)
    write_safetensors(path, tensors, metadata, recorder)


def rng_snapshot(rank: int) -> RngSnapshot:
    """This rank's RNG states now, keyed for `write_rng_state`."""
    prefix = f"rank{rank}/"
    version, words, gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    tensors = {
        prefix + "python": torch.tensor(words, dtype=torch.int64),
        prefix + "numpy": torch.from_numpy(np.asarray(np_keys, dtype=np.int64)),
        prefix + "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        for device, state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"{prefix}cuda/{device}"] = state
    metadata = {
        prefix + "python": json.dumps([version, gauss]),
        prefix + "numpy": json.dumps([np_name, int(np_pos), int(np_has_gauss), float(np_gauss)]),
    }
    return tensors, metadata


def load_rng_state(step_dir: str | os.PathLike[str], rank: int, world_size: int) -> None:
    """Restore this rank's RNG state from `rng_state.safetensors` (reads the file; no collective).

    Rank r takes saved rank `r % saved_world_size`. When the current run has more ranks than the saved
    one, a rank r >= saved_world_size then re-seeds python, numpy and torch (CPU and CUDA) with a seed
    derived from that saved torch state and r, so the added ranks draw distinct, reproducible streams.
    """
    step, _ = resolve_model_dir(step_dir)
    if step is None:
        raise NotACheckpointError(f"{os.fspath(step_dir)} has no training_state/; pass a step directory")
    path = layout.join(step, layout.TRAINING_STATE_DIR, layout.RNG_STATE)
    tensors, metadata = read_safetensors(path)
    saved_world = int(metadata.get("world_size", "0"))
    if saved_world < 1:
        raise CorruptCheckpointError(f"{path}: metadata has no world_size; the file is damaged")
    prefix = f"rank{rank % saved_world}/"
    version, gauss = json.loads(metadata[prefix + "python"])
    random.setstate((version, tuple(tensors[prefix + "python"].tolist()), gauss))
    np_name, np_pos, np_has_gauss, np_gauss = json.loads(metadata[prefix + "numpy"])
    np_keys = tensors[prefix + "numpy"].numpy().astype(np.uint32)
    np.random.set_state((np_name, np_keys, np_pos, np_has_gauss, np_gauss))
    torch.set_rng_state(tensors[prefix + "torch"])
    if torch.cuda.is_available():
        for device in range(torch.cuda.device_count()):
            key = f"{prefix}cuda/{device}"
            if key in tensors:
                torch.cuda.set_rng_state(tensors[key], device)
    if rank >= saved_world:
        digest = hashlib.sha256(tensors[prefix + "torch"].numpy().tobytes() + rank.to_bytes(8, "little"))
        seed = int.from_bytes(digest.digest()[:8], "little") >> 1
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)
