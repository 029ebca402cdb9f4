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
from ckpt_tools.format.untrusted import describe, parse_json
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


def _saved_world(metadata: dict[str, str], path: str) -> int:
    text = metadata.get("world_size", "")
    if not (text.isdigit() and len(text) <= 6 and int(text) >= 1):
        raise CorruptCheckpointError(
            f"{path}: metadata world_size is {describe(text)}, not a rank count; the file is damaged"
        )
    return int(text)


def _saved_states(
    tensors: dict[str, torch.Tensor], metadata: dict[str, str], prefix: str, path: str
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The python and numpy generator states of one saved rank, every part type-checked: the metadata
    is untrusted JSON (parsed by `parse_json`), the tensors must be there."""
    for key in ("python", "numpy", "torch"):
        if prefix + key not in tensors:
            raise CorruptCheckpointError(f"{path} lacks the tensor {prefix}{key}; the file is damaged")
    python = _metadata_list(metadata, prefix + "python", path, (int, (float, type(None))))
    numpy_meta = _metadata_list(metadata, prefix + "numpy", path, (str, int, int, (int, float)))
    words = tuple(tensors[prefix + "python"].tolist())
    keys = tensors[prefix + "numpy"].numpy().astype(np.uint32)
    return (python[0], words, python[1]), (numpy_meta[0], keys, *numpy_meta[1:])


def _metadata_list(metadata: dict[str, str], key: str, path: str, kinds: tuple[Any, ...]) -> list[Any]:
    """A metadata entry that must be a JSON list of len(kinds) values of those types (bools refused)."""
    if key not in metadata:
        raise CorruptCheckpointError(f"{path}: metadata lacks {key}; the file is damaged")
    value = parse_json(metadata[key].encode("utf-8", "surrogatepass"), f"{path}: metadata {key}")
    ok = isinstance(value, list) and len(value) == len(kinds)
    ok = ok and all(
        isinstance(v, kind) and not isinstance(v, bool) for v, kind in zip(value, kinds, strict=True)
    )
    if not ok:
        raise CorruptCheckpointError(
            f"{path}: metadata {key} is {describe(value)}, not the {len(kinds)} values a generator state "
            "holds; the file is damaged"
        )
    checked: list[Any] = value
    return checked


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
    saved_world = _saved_world(metadata, path)
    prefix = f"rank{rank % saved_world}/"
    try:  # the types are checked; a value the generators still reject (a wrong length) is one line too
        python, numpy_state = _saved_states(tensors, metadata, prefix, path)
        random.setstate(python)
        np.random.set_state(numpy_state)
        torch.set_rng_state(tensors[prefix + "torch"])
        if torch.cuda.is_available():
            for device in range(torch.cuda.device_count()):
                key = f"{prefix}cuda/{device}"
                if key in tensors:
                    torch.cuda.set_rng_state(tensors[key], device)
    except (ValueError, TypeError, RuntimeError, OverflowError) as exc:
        raise CorruptCheckpointError(
            f"{path}: the saved RNG state of {prefix.rstrip('/')} does not load ({' '.join(str(exc).split())[:200]}); "
            "the file is damaged: resume from an earlier step"
        ) from None
    if rank >= saved_world:
        digest = hashlib.sha256(tensors[prefix + "torch"].numpy().tobytes() + rank.to_bytes(8, "little"))
        seed = int.from_bytes(digest.digest()[:8], "little") >> 1
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)
