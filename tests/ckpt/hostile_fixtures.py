"""The smallest hostile checkpoints, built by hand for test_hostile.py.

Each builder writes under `tmp/ckpt` (the input whose tree must come out unchanged) and may place a
secret under `tmp/outside` that no command may read. DCP `.metadata` files are pickled from torch's own
metadata classes (protocol 2, so a value can be swapped for raw opcodes without frame lengths to fix).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pickle
import resource
import signal
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)

from ckpt_tools import layout
from helpers.launch import CKPT_CLI

MEMORY_LIMIT = 2 << 30
"""Address space of every command under test: torch imports in it, a memory bomb does not fit."""
TIMEOUT = 90
MARKER = b"SECRET-OUTSIDE-THE-CHECKPOINT-"
SENTINEL = "@@HOSTILE@@"
_LOAD = (
    "import sys\n"
    "from ckpt_tools import load_model_state_dict\n"
    "from ckpt_tools.errors import CheckpointError\n"
    "try:\n"
    "    state = load_model_state_dict(sys.argv[1])\n"
    "except CheckpointError as exc:\n"
    "    print('error: ' + ' '.join(str(exc).split()), file=sys.stderr)\n"
    "    sys.exit(1)\n"
    "print(f'loaded {len(state)} tensors')\n"
)


def _limits(file_limit: int | None, memory_limit: int = MEMORY_LIMIT) -> Callable[[], None]:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
        if file_limit is not None:  # a disk that fills up: writes past the limit fail (EFBIG)
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit, file_limit))

    return apply


def run_bounded(
    args: list[str], cwd: Path, file_limit: int | None = None, memory_limit: int = MEMORY_LIMIT
) -> subprocess.CompletedProcess[str]:
    """`ckpt *args` (or, for `load`, ckpt_tools.load_model_state_dict) in a fresh process under the
    address-space limit and the timeout; CKPT_DEBUG is dropped so the user's view is tested.
    `file_limit` caps the size of every file it writes, as a full disk would; `memory_limit` is the
    address-space limit (2 GiB unless given)."""
    command = [sys.executable, "-c", _LOAD, *args[1:]] if args[0] == "load" else [str(CKPT_CLI), *args]
    env = {k: v for k, v in os.environ.items() if k != "CKPT_DEBUG"}
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        preexec_fn=_limits(file_limit, memory_limit),
        env={**env, "OMP_NUM_THREADS": "1", "COLUMNS": "200"},
        cwd=cwd,
    )


def tree_state(root: Path) -> dict[str, str]:
    """Every entry under `root` (links not followed): file contents hashed, link targets, kinds."""
    state: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        mode = path.lstat().st_mode
        key = str(path.relative_to(root))
        if stat.S_ISLNK(mode):
            state[key] = "link:" + os.readlink(path)
        elif stat.S_ISREG(mode) and path.lstat().st_size > 64 << 20:  # a sparse giant: not read
            state[key] = f"large:{path.lstat().st_size}:{path.lstat().st_mtime_ns}"
        elif stat.S_ISREG(mode):
            state[key] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            state[key] = "dir" if stat.S_ISDIR(mode) else f"special:{stat.S_IFMT(mode)}"
    return state


def files_holding_marker(root: Path) -> list[str]:
    return [
        str(p) for p in root.rglob("*") if p.is_file() and not p.is_symlink() and MARKER in p.read_bytes()
    ]


def secret(tmp: Path, size: int = 64) -> Path:
    path = tmp / "outside" / "secret.bin"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes((MARKER * (size // len(MARKER) + 1))[:size])
    return path


def model_dir(tmp: Path) -> Path:
    path = tmp / "ckpt" / layout.PRETRAINED_MODEL_DIR
    path.mkdir(parents=True, exist_ok=True)
    return path


def dcp_dir(tmp: Path) -> Path:
    return model_dir(tmp) / layout.MODEL_DCP_DIR


# --- DCP -----------------------------------------------------------------------------------------


def raw_dcp(
    directory: Path,
    shape: tuple[int, ...],
    chunks: list[tuple[tuple[int, ...], tuple[int, ...]]],
    *,
    relative_path: str | None = None,
    record_length: int | None = None,
) -> Metadata:
    """A DCP directory by hand: float32 tensor `w` whose chunks are raw records, back to back in
    `__0_0.distcp` (or all named `relative_path`); `record_length` gives every record that length
    instead of its chunk's byte count (a small file for many large chunks). Returns the metadata."""
    file = "__0_0.distcp"
    storage, metas, offset = {}, [], 0
    for offsets, sizes in chunks:
        length = math.prod(sizes) * 4 if record_length is None else record_length
        metas.append(ChunkStorageMetadata(torch.Size(offsets), torch.Size(sizes)))
        storage[MetadataIndex("w", torch.Size(offsets))] = _StorageInfo(relative_path or file, offset, length)
        offset += length
    entry = TensorStorageMetadata(TensorProperties(dtype=torch.float32), torch.Size(shape), metas)
    metadata = Metadata(state_dict_metadata={"w": entry}, storage_data=storage)
    directory.mkdir(parents=True, exist_ok=True)
    write_metadata(directory, metadata)
    (directory / file).write_bytes(bytes(offset))
    return metadata


def write_metadata(directory: Path, metadata: object, swap: bytes | None = None) -> None:
    """Pickle `metadata`; with `swap`, the opcode of the string SENTINEL is replaced by those bytes."""
    data = pickle.dumps(metadata, protocol=2)
    if swap is not None:
        sentinel = b"X" + len(SENTINEL).to_bytes(4, "little") + SENTINEL.encode()
        assert data.count(sentinel) == 1
        data = data.replace(sentinel, swap)
    (directory / layout.DCP_METADATA).write_bytes(data)


def small_dcp(tmp: Path) -> tuple[Path, Metadata]:
    """`w` [4, 4] in two row chunks: the base every metadata edit starts from."""
    directory = dcp_dir(tmp)
    return directory, raw_dcp(directory, (4, 4), [((0, 0), (2, 4)), ((2, 0), (2, 4))])


def edited_dcp(tmp: Path, edit, swap: bytes | None = None) -> Path:  # type: ignore[no-untyped-def]
    directory, metadata = small_dcp(tmp)
    edit(metadata)
    write_metadata(directory, metadata, swap)
    return model_dir(tmp)


def garbage_only_metadata() -> Metadata:
    """A `.metadata` whose one entry is a non-tensor (opaque bytes): no model in it."""
    storage = {MetadataIndex("junk"): _StorageInfo("__0_0.distcp", 0, 8)}
    return Metadata(state_dict_metadata={"junk": BytesStorageMetadata()}, storage_data=storage)


def first_chunk(metadata: Metadata) -> ChunkStorageMetadata:
    return metadata.state_dict_metadata["w"].chunks[0]


def first_record(metadata: Metadata) -> _StorageInfo:
    return next(iter(metadata.storage_data.values()))


def set_field(obj: object, name: str, value: object) -> None:
    object.__setattr__(obj, name, value)  # torch's metadata dataclasses are frozen


def nested_list_opcodes(depth: int) -> bytes:
    """A list nested `depth` deep, as pickle opcodes: EMPTY_LIST x depth, then APPEND x (depth - 1)."""
    return b"]" * depth + b"a" * (depth - 1)


def long_opcodes(value: int) -> bytes:
    """LONG4: an integer of any size in a few bytes per digit group."""
    raw = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8b" + len(raw).to_bytes(4, "little") + raw


class SelfReferencingLayout:
    """Unpickled by torch, this asks torch.serialization._get_layout about a list holding itself."""

    def __reduce__(self):  # type: ignore[no-untyped-def]
        loop: list = []
        loop.append(loop)
        return (torch.serialization._get_layout, (loop,))


# --- safetensors, JSON, adapters ------------------------------------------------------------------


def secret_safetensors(tmp: Path) -> Path:
    """A valid safetensors file outside the checkpoint whose one tensor holds the marker bytes."""
    path = tmp / "outside" / "secret.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"w": torch.frombuffer(bytearray(MARKER * 4), dtype=torch.uint8)}, str(path))
    return path


def raw_safetensors(path: Path, header: bytes, data: bytes = b"\0" * 4) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(len(header).to_bytes(8, "little") + header + data)
    return path


def step_with_training_step(tmp: Path, text: str | None = None, **fields: object) -> Path:
    """A step directory (safetensors) whose training_step.json has `fields` changed, or is `text`."""
    step_dir = tmp / "ckpt" / "000005"
    model = step_dir / layout.PRETRAINED_MODEL_DIR
    state = step_dir / layout.TRAINING_STATE_DIR
    model.mkdir(parents=True)
    state.mkdir()
    save_file({"w": torch.zeros(2)}, str(model / layout.MODEL_SAFETENSORS))
    save_file({"torch_cpu": torch.zeros(4, dtype=torch.uint8)}, str(state / layout.RNG_STATE))
    save_file({"state/w/exp_avg": torch.zeros(2)}, str(state / layout.OPTIMIZER_SAFETENSORS))
    (state / layout.OPTIMIZER_PARAM_GROUPS).write_text('[{"params": ["w"]}]')
    data = {
        "format_version": 1,
        "step": 5,
        "dp_world_size": 1,
        "batch_size": 8,
        "grad_accum_steps": 1,
        "mixed_precision": "no",
        "topology": {"dp_replicate": 1, "dp_shard": 1, "cp_size": 1, "tp_size": 1},
        "checkpoint_format": "safetensors",
        "sampler": {"epoch": 0, "offset": 0},
    }
    for key, value in fields.items():
        target, name = (data[key.split(".")[0]], key.split(".")[1]) if "." in key else (data, key)
        target[name] = value  # type: ignore[index]
    (state / layout.TRAINING_STEP).write_text(text if text is not None else json.dumps(data))
    return step_dir


def adapter_pair(tmp: Path, rank: int = 2, **config: object) -> Path:
    """A base model and a LoRA adapter for it (module `q`, 4x4); `config` edits adapter_config.json."""
    base = tmp / "ckpt" / "base"
    base.mkdir(parents=True)
    save_file({"q.weight": torch.ones(4, 4)}, str(base / layout.MODEL_SAFETENSORS))
    adapter = tmp / "ckpt" / "adapter"
    adapter.mkdir()
    tensors = {
        "base_model.model.q.lora_A.weight": torch.ones(rank, 4),
        "base_model.model.q.lora_B.weight": torch.ones(4, rank),
    }
    save_file(tensors, str(adapter / layout.ADAPTER_SAFETENSORS))
    document = {"peft_type": "LORA", "r": rank, "lora_alpha": 4, "base_model_name_or_path": str(base)}
    (adapter / layout.ADAPTER_CONFIG).write_text(json.dumps({**document, **config}))
    return adapter
