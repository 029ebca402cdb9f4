"""Torch tensor I/O: whole safetensors files and DCP directories, local or through fsspec.

The one module where checkpoint tensors become torch tensors and back; saving, loading, conversion
and diff all read and write through it. DCP metadata goes through the restricted unpickler before
torch unpickles it.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from ckpt_tools.dcp.chunk_tiling import read_tiled_index
from ckpt_tools.dcp.index import DcpIndex
from ckpt_tools.errors import CorruptCheckpointError
from ckpt_tools.files import manifest, storage
from ckpt_tools.files.digest import HashingFileSystem, Recorder
from ckpt_tools.files.safetensors_io import SafetensorsHeader, read_safetensors_header
from ckpt_tools.files.safetensors_writer import SafetensorsStreamWriter, TensorSpec, aligned_order
from ckpt_tools.files.sharded_safetensors import shard_headers
from ckpt_tools.format import layout
from ckpt_tools.format.dtypes import safetensors_code


def write_safetensors(
    path: str,
    tensors: Mapping[str, torch.Tensor],
    metadata: dict[str, str] | None = None,
    recorder: Recorder | None = None,
) -> None:
    """Write one safetensors file (local path or fsspec URL). Tensors sharing memory (tied weights)
    are copied, since the format stores each tensor on its own. With a `recorder`, the file is
    serialized once in memory and hashed from those bytes as they are written."""
    from safetensors.torch import save, save_file

    seen: set[int] = set()
    out: dict[str, torch.Tensor] = {}
    for key, tensor in tensors.items():
        tensor = tensor.detach().cpu().contiguous()
        ptr = tensor.untyped_storage().data_ptr()
        out[key] = tensor.clone() if ptr in seen and tensor.numel() else tensor
        seen.add(ptr)
    fs, inner = storage.resolve(path)
    if recorder is not None:
        manifest.write_bytes(path, save(out, metadata=metadata), recorder)
    elif storage.is_local(fs):
        save_file(out, inner, metadata=metadata)
    else:
        storage.write_bytes(path, save(out, metadata=metadata))


def tensor_spec(name: str, tensor: torch.Tensor) -> TensorSpec:
    """The header entry of one tensor (a DTensor's global shape)."""
    return TensorSpec(name, safetensors_code(str(tensor.dtype)), tuple(tensor.shape))


def tensor_specs(tensors: Mapping[str, torch.Tensor]) -> list[TensorSpec]:
    """The header entries of `tensors` in the safetensors library's file order (`aligned_order`)."""
    return aligned_order([tensor_spec(name, t) for name, t in tensors.items()])


def write_tensor_bytes(writer: SafetensorsStreamWriter, tensor: torch.Tensor) -> None:
    """Append one tensor's bytes, from its own memory when it is a CPU tensor laid out in order."""
    data = tensor.detach().cpu().contiguous()
    if data.numel():
        writer.write(data.reshape(-1).view(torch.uint8).numpy())


def stream_safetensors(
    path: str,
    tensors: Mapping[str, torch.Tensor],
    metadata: dict[str, str] | None = None,
    recorder: Recorder | None = None,
) -> None:
    """Write a large safetensors file (local path or fsspec URL) tensor by tensor: the bytes
    `safetensors.torch.save` writes, without serializing them in memory first (`write_safetensors`
    does, to hash them), hashed as they pass with a `recorder`. Nothing is copied but a tensor that is
    not a CPU tensor laid out in order."""
    writer = SafetensorsStreamWriter(path, tensor_specs(tensors), metadata, recorder)
    try:
        for spec in writer.specs:
            write_tensor_bytes(writer, tensors[spec.name])
        writer.close()
    except BaseException:
        writer.discard()
        raise
    writer.commit()


def read_safetensors(path: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors and header metadata of one safetensors file, local or through fsspec."""
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load

    fs, inner = storage.resolve(path)
    header = read_safetensors_header(path)  # every reader validates alike (verify's rules), names the file
    try:
        if storage.is_local(fs):
            with safe_open(inner, framework="pt") as handle:
                tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118
                return tensors, handle.metadata() or {}
        return load(storage.read_bytes(path)), header.metadata
    except SafetensorError as exc:
        raise CorruptCheckpointError(f"{path}: {exc}; the file is damaged, re-copy or re-save it") from exc


def read_safetensors_model(model_dir: str) -> dict[str, torch.Tensor]:
    """`model.safetensors`, or every shard named by `model.safetensors.index.json`."""
    single = layout.join(model_dir, layout.MODEL_SAFETENSORS)
    if storage.exists(single):
        return read_safetensors(single)[0]
    index_path = layout.join(model_dir, layout.MODEL_INDEX)
    headers = shard_headers(index_path)  # every shard present and whole, every tensor where the index says
    tensors: dict[str, torch.Tensor] = {}
    for path in sorted({header.path for header in headers.values()}):
        tensors.update(read_safetensors(path)[0])
    return tensors


def read_safetensors_block(
    header: SafetensorsHeader, name: str, offset: Sequence[int], shape: Sequence[int]
) -> torch.Tensor:
    """The block `[offset, offset + shape)` of one tensor of a safetensors file (local or fsspec URL),
    read straight into a new tensor from the rows it spans: one ranged read, not the file. For a
    Shard(0) block (an FSDP2 shard) that is exactly the block's bytes; a block narrower in a later
    dimension reads its whole rows."""
    from ckpt_tools.format.dtypes import SAFETENSORS_TO_TORCH

    info = header.tensors[name]
    full = info.shape
    dtype = getattr(torch, SAFETENSORS_TO_TORCH[info.dtype])
    first, count = (offset[0], shape[0]) if full else (0, 1)
    rows = torch.empty((count, *full[1:]) if full else (), dtype=dtype)
    row_bytes = info.nbytes // full[0] if full and full[0] else info.nbytes
    target = rows.reshape(-1).view(torch.uint8).numpy().data  # the tensor's own memory
    if len(target):
        with storage.open_file(header.path, "rb") as handle:
            handle.seek(header.data_start + info.data_offsets[0] + first * row_bytes)
            done = 0
            while done < len(target):
                got = handle.readinto(target[done:])
                if not got:
                    raise CorruptCheckpointError(f"{header.path}: {name} ends early; the file is truncated")
                done += got
    for dim in range(1, len(full)):
        rows = rows.narrow(dim, offset[dim], shape[dim])
    return rows


@contextlib.contextmanager
def quiet_single_process() -> Iterator[None]:
    """Silence DCP's warning that it runs without a process group: in one process that is the intent."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninit")
        yield


def dcp_stage(state_dict: dict[str, Any], path: str) -> dict[str, Any]:
    """A copy of `state_dict` taken now: what a background write of the step's state then writes,
    whatever training does to the live tensors. CPU tensors (DTensors included) are cloned in place;
    a state on an accelerator goes through the DCP writer's own staging, which copies it to CPU memory."""
    if any(t.device.type != "cpu" for t in _tensors(state_dict)):
        stage = getattr(dcp_writer(path), "stage", None)
        if stage is not None:
            return stage(state_dict)
    return _clone(state_dict)


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _tensors(item)


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {key: _clone(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_clone(item) for item in value)
    return copy.deepcopy(value)


class _Staged:
    """The AsyncStager of a state dict that `dcp_stage` already copied: DCP's async save stages
    nothing more."""

    should_synchronize_after_execute = False

    def stage(self, state_dict: Any) -> Any:
        return state_dict

    def synchronize_staging(self) -> None:
        pass

    def close(self) -> None:
        pass


def dcp_async_save(
    staged: dict[str, Any], path: str, process_group: Any, distributed: bool, recorder: Recorder | None = None
) -> Any:
    """Write a `dcp_stage`d state dict into `path` in a background thread with DCP's async save; returns
    the future of the write. Collective when `distributed`, over `process_group`, which the background
    thread uses alone (a group of its own per pending write). With a `recorder`, each file this rank
    writes is hashed as its bytes go out."""
    writer = dcp_writer(path)
    if recorder is not None:
        writer.fs = HashingFileSystem(writer.fs, recorder)  # type: ignore[attr-defined]
    with quiet_single_process():
        return dcp.async_save(
            staged,
            storage_writer=writer,
            process_group=process_group,
            no_dist=not distributed,
            async_stager=_Staged(),  # type: ignore[arg-type]
        )


def dcp_writer(path: str) -> dcp.StorageWriter:
    """A DCP writer for a local directory or an fsspec URL (torch's `FsspecWriter`).

    On a URL, `sync_files=False`: torch would call `os.fsync(stream.fileno())`, which an object-store
    stream does not have, and fall back to `os.sync()`, flushing every disk of the machine while the
    object itself is only uploaded by `close()` (pytorch/pytorch#142396). An object exists once its
    upload completes, so closing is the sync; the step commit (`commit.py`) makes the whole directory
    visible only after every rank's writer has closed its files."""
    if layout.is_url(path):
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter  # not re-exported

        return FsspecWriter(path, sync_files=False, **storage.FSSPEC_OPTIONS)
    return dcp.FileSystemWriter(path)


def dcp_reader(path: str) -> dcp.StorageReader:
    """A DCP reader for a local directory or an fsspec URL (torch's `FsspecReader`)."""
    if layout.is_url(path):
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader  # not re-exported

        return FsspecReader(path, **storage.FSSPEC_OPTIONS)
    return dcp.FileSystemReader(path)


def dcp_save(
    state_dict: dict[str, Any],
    path: str,
    process_group: Any,
    distributed: bool,
    recorder: Recorder | None = None,
) -> None:
    """Collective when `distributed`: every rank writes its shards of `state_dict` into `path`; with a
    `recorder`, each file this rank writes is hashed as its bytes go out."""
    writer = dcp_writer(path)
    if recorder is not None:
        writer.fs = HashingFileSystem(writer.fs, recorder)  # type: ignore[attr-defined]
    with quiet_single_process():
        dcp.save(state_dict, storage_writer=writer, process_group=process_group, no_dist=not distributed)


def dcp_load(state_dict: dict[str, Any], path: str, process_group: Any, distributed: bool) -> None:
    """Collective when `distributed`: fill `state_dict` in place from a DCP directory, resharding onto
    its tensors. The metadata is checked by the restricted unpickler first."""
    validate_dcp_metadata(path)
    with quiet_single_process():
        dcp.load(
            state_dict, storage_reader=dcp_reader(path), process_group=process_group, no_dist=not distributed
        )


def validate_dcp_metadata(dcp_dir: str) -> DcpIndex:
    """Check a DCP directory before torch reads it: `.metadata` through the restricted unpickler (a
    crafted pickle is refused, UnsafePickleError, instead of running code), every record inside the
    directory, every file present and every tensor's chunks tiling it."""
    return read_tiled_index(dcp_dir)


def read_dcp_full(dcp_dir: str, keys: Mapping[str, str] | None = None) -> dict[str, torch.Tensor]:
    """Tensors of a DCP directory as full CPU tensors, in this process alone: every tensor under its
    saved key, or with `keys` (name to return -> saved key) only those, renamed."""
    validate_dcp_metadata(dcp_dir)
    metadata = dcp_reader(dcp_dir).read_metadata()
    wanted = dict(keys) if keys is not None else {key: key for key in metadata.state_dict_metadata}
    state: dict[str, Any] = {}
    for saved in wanted.values():
        entry = metadata.state_dict_metadata[saved]
        if isinstance(entry, TensorStorageMetadata):
            state[saved] = torch.empty(entry.size, dtype=entry.properties.dtype)
    with quiet_single_process():
        dcp.load(state, storage_reader=dcp_reader(dcp_dir), no_dist=True)
    return {name: state[saved] for name, saved in wanted.items() if saved in state}
