"""Streaming conversion between DCP shard directories and safetensors, with bounded memory.

Every other tool (torch's `dcp_to_torch_save`, accelerate's `merge_fsdp_weights`) loads the whole
model into RAM before writing it. Here the safetensors header is computed from the DCP chunk table
first, then each tensor's bytes are copied from its chunks, in file order, straight out of the `.distcp`
records (`dcp_index.locate_chunk_data`). Bytes that need no change never pass through Python; a dtype
cast works block by block; only a tensor whose chunks are not row ranges (split along an inner
dimension) is assembled in memory, one tensor at a time. torch is imported only for those two cases.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any

from ckpt_tools.catalog import ADAPTER, DCP, MODEL, SAFETENSORS, SHARDED_SAFETENSORS, catalog
from ckpt_tools.dcp.chunk_tiling import check_tiling
from ckpt_tools.dcp.index import ChunkEntry, TensorEntry, locate_chunk_data, model_tensors, read_dcp_index
from ckpt_tools.errors import CheckpointError, CorruptCheckpointError, NotACheckpointError, OutputExistsError
from ckpt_tools.files import storage
from ckpt_tools.files.safetensors_io import read_safetensors_header, read_weight_map
from ckpt_tools.files.safetensors_writer import COPY_BLOCK, SafetensorsStreamWriter, TensorSpec, aligned_order
from ckpt_tools.format import layout
from ckpt_tools.format.dtypes import FLOATING, ITEMSIZE, SAFETENSORS_TO_TORCH, USER_DTYPES, dtype_name
from ckpt_tools.tools import companions, convert_plan

Progress = Callable[[int, int], None]
"""Called as `progress(bytes_written_so_far, total_bytes)` while a conversion writes (a progress bar)."""
_Advance = Callable[[int], None]

SAFETENSORS_METADATA = {"format": "pt"}  # transformers refuses files without it
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_UNITS |= {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_MAX_OPEN_FILES = 64


@dataclass(frozen=True)
class ConversionResult:
    """What a conversion wrote. `files` are final paths; `index_file` is set for sharded output."""

    source: str
    files: tuple[str, ...]
    index_file: str | None
    num_tensors: int
    total_bytes: int
    dtype: str | None
    deleted_source: bool
    companions: tuple[str, ...] = ()  # configs and processors copied into a separate output directory

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__, files=list(self.files), companions=list(self.companions))


def parse_size(text: str | int) -> int:
    """`5GB` -> 5_000_000_000 (decimal, as the Hub counts), `2GiB` -> 2**31, `1000` -> 1000 bytes."""
    if isinstance(text, int):
        return text
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"--max-shard-size {text!r} is not a size; use e.g. 5GB, 500MB or 2GiB")
    size = int(float(match.group(1)) * _UNITS[(match.group(2) or "B").upper()])
    if size <= 0:
        raise ValueError(f"--max-shard-size {text!r} must be positive")
    return size


# --- DCP -> safetensors --------------------------------------------------------------------------


def convert_dcp_to_safetensors(
    path: str | os.PathLike[str],
    output: str | os.PathLike[str] | None = None,
    *,
    dtype: str | None = None,
    max_shard_size: str | int | None = None,
    delete_dcp: bool = False,
    keep_source: bool = False,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> ConversionResult:
    """Convert the DCP model (or PEFT adapter) shards of a checkpoint into safetensors, streaming.

    `path`: a step directory, `checkpoints/last`, a `pretrained_model/`, or a bare DCP directory
    (accelerate's `pytorch_model_fsdp_0/` included). `output`: the directory to write into; default
    beside the shards. `dtype`: `bf16`/`fp16`/`fp32`/`fp64` casts floating tensors, others untouched;
    a cast is a copy that never replaces the full-precision weights (`convert_plan`): it defaults to
    `<step>/export-<dtype>/`.
    `max_shard_size` (`5GB`): write `model-0000k-of-0000n.safetensors` plus the index transformers
    reads. Only model weights are written (a combined model+optimizer DCP keeps its `model` part).
    Files are written under temporary names, re-read and checked against the DCP metadata, then
    renamed; `delete_dcp` removes the shards only after that (`keep_source`: plan and check as for
    a deletion, but leave it to the caller, who deletes with `delete_source` after a publish). Peak memory stays at a copy buffer
    (or the largest tensor split along an inner dimension), whatever the model size.
    """
    source, stem = _find_dcp_source(path)
    target = _target_dtype(dtype)
    out_dir = convert_plan.output_dir(source, output, dtype, delete_dcp)
    if delete_dcp:
        _refuse_inside(out_dir, source, "--output", "the DCP directory that --delete-dcp removes")
    index = read_dcp_index(source)
    tensors = model_tensors(index)
    if not tensors:
        raise NotACheckpointError(f"{source} holds no model tensors; nothing to convert")
    for entry in tensors.values():
        check_tiling(entry, source)  # no hole, no element twice, before the first byte is written
    shards = _plan_shards(tensors, target, stem, parse_size(max_shard_size) if max_shard_size else None)
    _check_outputs(out_dir, stem, overwrite)
    model_dir = source.rsplit("/", 1)[0]  # the configs and processors beside the shards
    extra = companions.companion_names(model_dir, adapter=stem != "model")
    companions.check_companions(model_dir, out_dir, extra, overwrite)
    total = sum(spec.nbytes for _, specs in shards for spec in specs)
    paths = _write_shards(source, out_dir, tensors, shards, _advance(progress, total))
    index_file = _write_index(out_dir, shards) if len(shards) > 1 else None
    _remove_stale(out_dir, stem, {name for name, _ in shards})
    copied = companions.copy_companions(model_dir, out_dir, extra)
    deleted = delete_dcp and not keep_source
    if deleted:
        delete_source(source)
    return ConversionResult(
        source, tuple(paths), index_file, len(tensors), total, target, deleted, tuple(copied)
    )


def delete_source(source: str) -> None:
    """Remove converted DCP shards; a step's `training_step.json` then names what it holds."""
    storage.remove_tree(source)
    convert_plan.record_deleted_dcp(source)


def check_deletable_source(path: str | os.PathLike[str], output: str | os.PathLike[str] | None) -> str:
    """The DCP directory a conversion of `path` reads, refused (before anything is written) when the
    output directory would lie inside it, since deleting the shards would delete the output too."""
    source, _ = _find_dcp_source(path)
    out_dir = convert_plan.output_dir(source, output, None, delete_dcp=True)
    _refuse_inside(out_dir, source, "--output", "the DCP directory that --delete-dcp removes")
    return source


def _inside(path: str, root: str) -> bool:
    """Whether `path` is `root` or lies below it (after symlinks on local disk); never touches either."""
    fs_path, inner_path = storage.resolve(path)
    fs_root, inner_root = storage.resolve(root)
    if storage.is_local(fs_path) != storage.is_local(fs_root):
        return False
    if storage.is_local(fs_path):
        inner_path, inner_root = os.path.realpath(inner_path), os.path.realpath(inner_root)
    inner_path, inner_root = inner_path.rstrip("/"), inner_root.rstrip("/")
    return inner_path == inner_root or inner_path.startswith(inner_root + "/")


def _refuse_inside(path: str, root: str, what: str, root_is: str) -> None:
    if _inside(path, root):
        raise CheckpointError(
            f"{what} {path} lies inside {root}, {root_is}: refused; choose a path outside it"
        )


def _advance(progress: Progress | None, total: int) -> _Advance:
    """Count written bytes into `progress`; a no-op without one."""
    if progress is None:
        return lambda count: None
    done = 0

    def advance(count: int) -> None:
        nonlocal done
        done += count
        progress(done, total)

    progress(0, total)
    return advance


def _find_dcp_source(path: str | os.PathLike[str]) -> tuple[str, str]:
    """(DCP directory, output stem `model` or `adapter_model`), from the catalog of `path`."""
    found = [w for w in catalog(path).weight_sets if w.format == DCP and w.role in (MODEL, ADAPTER)]
    if not found:
        raise NotACheckpointError(
            f"{os.fspath(path)} has no DCP shards ({layout.MODEL_DCP_DIR}/ or {layout.ADAPTER_DCP_DIR}/ "
            f"with a {layout.DCP_METADATA}); it needs no conversion, or pass the DCP directory itself"
        )
    source = next((w for w in found if w.role == ADAPTER), found[0])
    is_adapter = source.role == ADAPTER
    return source.path, _stem(layout.ADAPTER_SAFETENSORS if is_adapter else layout.MODEL_SAFETENSORS)


def _stem(file_name: str) -> str:
    return file_name.removesuffix(".safetensors")


def _target_dtype(dtype: str | None) -> str | None:
    if dtype is None:
        return None
    name = dtype_name(dtype)
    if name is None:
        raise ValueError(f"--dtype {dtype!r} is not one of {', '.join(USER_DTYPES)}")
    return USER_DTYPES[name]


def _out_dtype(entry: TensorEntry, target: str | None) -> str:
    return target if target is not None and entry.dtype in FLOATING else entry.dtype


def _plan_shards(
    tensors: dict[str, TensorEntry], target: str | None, stem: str, max_size: int | None
) -> list[tuple[str, list[TensorSpec]]]:
    """Greedy split in name order (as huggingface_hub does); a tensor larger than the limit gets its own
    shard. Inside a file, tensors are in aligned order."""
    specs = [TensorSpec(name, _out_dtype(e, target), e.shape) for name, e in sorted(tensors.items())]
    groups: list[list[TensorSpec]] = [[]]
    size = 0
    for spec in specs:
        if max_size is not None and groups[-1] and size + spec.nbytes > max_size:
            groups.append([])
            size = 0
        groups[-1].append(spec)
        size += spec.nbytes
    if len(groups) == 1:
        return [(f"{stem}.safetensors", aligned_order(groups[0]))]
    if stem != _stem(layout.MODEL_SAFETENSORS):
        raise ValueError("adapters are written as one file (PEFT reads no index); drop --max-shard-size")
    return [(layout.sharded_model_name(i + 1, len(groups)), aligned_order(g)) for i, g in enumerate(groups)]


def _sharded_name(stem: str) -> re.Pattern[str]:
    return re.compile(rf"^{re.escape(stem)}-\d{{5}}-of-\d{{5}}\.safetensors$")


def _existing_outputs(out_dir: str, stem: str) -> list[str]:
    pattern = _sharded_name(stem)
    names = storage.list_names(out_dir)
    fixed = {f"{stem}.safetensors", f"{stem}.safetensors.index.json"}
    return sorted(n for n in names if n in fixed or pattern.match(n))


def _check_outputs(out_dir: str, stem: str, overwrite: bool) -> None:
    existing = _existing_outputs(out_dir, stem)
    if existing and not overwrite:
        raise OutputExistsError(
            f"{layout.join(out_dir, existing[0])} already exists; pass --overwrite to replace it"
        )


def _remove_stale(out_dir: str, stem: str, written: set[str]) -> None:
    """After an overwrite, drop the files of the other layout (old shards, old index or single file)."""
    fs, inner = storage.resolve(out_dir)
    for name in _existing_outputs(out_dir, stem):
        if name not in written and not (len(written) > 1 and name == f"{stem}.safetensors.index.json"):
            fs.rm(f"{inner}/{name}")


def _write_shards(
    source: str,
    out_dir: str,
    tensors: dict[str, TensorEntry],
    shards: list[tuple[str, list[TensorSpec]]],
    progress: _Advance,
) -> list[str]:
    """Write every shard under a temporary name, check each, then rename them all."""
    storage.makedirs(out_dir)
    writers: list[SafetensorsStreamWriter] = []
    try:
        with _OpenFiles(source) as files:
            for file_name, specs in shards:
                writer = SafetensorsStreamWriter(layout.join(out_dir, file_name), specs, SAFETENSORS_METADATA)
                writers.append(writer)
                for spec in specs:
                    _write_tensor(writer, tensors[spec.name], spec.dtype, files, progress)
                writer.close()
                _check_written(writer.tmp_path, specs)
    except BaseException:
        for writer in writers:
            writer.discard()
        raise
    for writer in writers:
        writer.commit()
    return [writer.path for writer in writers]


def _check_written(path: str, specs: Sequence[TensorSpec]) -> None:
    """Re-read the header just written: names, dtypes, shapes and byte counts as planned."""
    header = read_safetensors_header(path)
    got = {name: (i.dtype, i.shape, i.nbytes) for name, i in header.tensors.items()}
    want = {s.name: (s.dtype, s.shape, s.nbytes) for s in specs}
    if got != want:
        raise CorruptCheckpointError(f"{path}: the written header does not match the DCP metadata")


def _write_index(out_dir: str, shards: list[tuple[str, list[TensorSpec]]]) -> str:
    """`model.safetensors.index.json` in the layout transformers and huggingface_hub read."""
    weight_map = {spec.name: file_name for file_name, specs in shards for spec in specs}
    total = sum(spec.nbytes for _, specs in shards for spec in specs)
    document = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    path = layout.join(out_dir, layout.MODEL_INDEX)
    tmp = layout.join(out_dir, layout.TMP_PREFIX + layout.MODEL_INDEX)
    storage.write_text(tmp, json.dumps(document, indent=2) + "\n")
    fs, inner = storage.resolve(tmp)
    fs.mv(inner, storage.resolve(path)[1])
    return path


class _OpenFiles:
    """Open `.distcp` files by name, a bounded number at a time (a 1000-rank checkpoint has 1000)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self._open: dict[str, IO[bytes]] = {}

    def chunk(self, entry: TensorEntry, chunk: ChunkEntry) -> tuple[IO[bytes], str]:
        """The open file holding `chunk`, and how errors name the chunk."""
        return self.get(chunk.file), f"{self.source}/{chunk.file} ({entry.name} at {list(chunk.offsets)})"

    def get(self, name: str) -> IO[bytes]:
        handle = self._open.get(name)
        if handle is None:
            if len(self._open) >= _MAX_OPEN_FILES:
                self._open.pop(next(iter(self._open))).close()
            handle = storage.open_regular(layout.join(self.source, name))
            self._open[name] = handle
        return handle

    def __enter__(self) -> _OpenFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._open.values():
            handle.close()


def _write_tensor(
    writer: SafetensorsStreamWriter, entry: TensorEntry, out_dtype: str, files: _OpenFiles, progress: _Advance
) -> None:
    ordered = _row_ordered_chunks(entry)
    if ordered is None:
        writer.write(_tensor_bytes(_assemble(entry, out_dtype, files)))
        progress(entry.nbytes // ITEMSIZE[entry.dtype] * ITEMSIZE[out_dtype])
        return
    for chunk in ordered:
        handle, where = files.chunk(entry, chunk)
        span = locate_chunk_data(handle, chunk, entry.dtype, where)
        if span is None:
            writer.write(_tensor_bytes(_load_chunk(handle, chunk, where).to(_torch_dtype(out_dtype))))
        elif out_dtype == entry.dtype:
            writer.copy_from(handle, span.offset, span.length)
        else:
            _write_cast(writer, handle, span.offset, span.length, entry.dtype, out_dtype)
        progress(chunk.numel * ITEMSIZE[out_dtype])


def _row_ordered_chunks(entry: TensorEntry) -> list[ChunkEntry] | None:
    """The chunks in file order when each is a run of whole rows and together they tile the tensor
    (FSDP and HSDP shard dim 0, so this is the common case); None otherwise."""
    strides = _strides(entry.shape)
    placed = []
    for chunk in entry.chunks:
        if chunk.numel == 0:
            continue
        if not _is_row_run(chunk, entry.shape):
            return None
        placed.append((sum(o * s for o, s in zip(chunk.offsets, strides, strict=True)), chunk))
    placed.sort(key=lambda item: item[0])
    position = 0
    for start, chunk in placed:
        if start != position:
            return None
        position += chunk.numel
    return [chunk for _, chunk in placed]


def _is_row_run(chunk: ChunkEntry, shape: tuple[int, ...]) -> bool:
    """The chunk's box is one contiguous range of the row-major tensor."""
    dims = list(zip(chunk.sizes, shape, strict=True))
    first = next((i for i, (size, _) in enumerate(dims) if size != 1), len(dims))
    return all(size == full for size, full in dims[first + 1 :])


def _strides(shape: tuple[int, ...]) -> list[int]:
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step)
        step *= dim
    return strides[::-1]


def _write_cast(
    writer: SafetensorsStreamWriter, handle: IO[bytes], offset: int, length: int, src: str, dst: str
) -> None:
    """Cast block by block: memory stays at one block whatever the tensor size."""
    import torch

    block = COPY_BLOCK - COPY_BLOCK % ITEMSIZE[src]
    handle.seek(offset)
    for start in range(0, length, block):
        raw = bytearray(handle.read(min(block, length - start)))
        values = torch.frombuffer(raw, dtype=_torch_dtype(src)) if raw else torch.empty(0)
        writer.write(_tensor_bytes(values.to(_torch_dtype(dst))))


def _assemble(entry: TensorEntry, out_dtype: str, files: _OpenFiles) -> Any:
    """A tensor split along an inner dimension, assembled in memory (this tensor only)."""
    import torch

    full = torch.empty(entry.shape, dtype=_torch_dtype(out_dtype))
    for chunk in entry.chunks:
        if chunk.numel == 0:
            continue
        handle, where = files.chunk(entry, chunk)
        box = tuple(slice(o, o + s) for o, s in zip(chunk.offsets, chunk.sizes, strict=True))
        full[box].copy_(_read_chunk(handle, chunk, entry.dtype, where))
    return full


def _read_chunk(handle: IO[bytes], chunk: ChunkEntry, dtype: str, where: str) -> Any:
    import torch

    span = locate_chunk_data(handle, chunk, dtype, where)
    if span is None:
        return _load_chunk(handle, chunk, where)
    handle.seek(span.offset)
    raw = bytearray(handle.read(span.length))
    return torch.frombuffer(raw, dtype=_torch_dtype(dtype)).reshape(chunk.sizes) if raw else torch.empty(0)


def _load_chunk(handle: IO[bytes], chunk: ChunkEntry, where: str) -> Any:
    """torch's own `weights_only` loader, for records the offset reader does not handle."""
    import io

    import torch

    if chunk.transforms:
        raise CorruptCheckpointError(
            f"{where} was saved with storage transforms {list(chunk.transforms)}; convert it with "
            "torch.distributed.checkpoint.format_utils.dcp_to_torch_save instead"
        )
    handle.seek(chunk.file_offset)
    record = io.BytesIO(handle.read(chunk.length))
    try:
        tensor = torch.load(record, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CorruptCheckpointError(f"{where}: unreadable chunk record ({exc})") from None
    if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != chunk.sizes:
        raise CorruptCheckpointError(f"{where}: chunk record does not hold a tensor of shape {chunk.sizes}")
    return tensor


def _torch_dtype(code: str) -> Any:
    import torch

    return getattr(torch, SAFETENSORS_TO_TORCH[code])


def _tensor_bytes(tensor: Any) -> memoryview:
    import torch

    flat = tensor.detach().contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")


# --- safetensors -> DCP --------------------------------------------------------------------------


def convert_safetensors_to_dcp(
    path: str | os.PathLike[str],
    output: str | os.PathLike[str] | None = None,
    *,
    overwrite: bool = False,
) -> ConversionResult:
    """Turn `model.safetensors` (or a sharded set with its index, or `adapter_model.safetensors`) into
    a DCP directory that a sharded run loads onto any topology (to start FSDP2 from published weights).

    `path`: a model directory, a step directory or a `.safetensors` file. `output`: the DCP directory;
    default `pytorch_model_fsdp_0/` (`adapter_model_fsdp_0/` for an adapter) beside the input. Tensors
    are memory-mapped, not read into RAM. Written under a temporary name and renamed when complete.
    """
    import torch.distributed.checkpoint as dcp

    from ckpt_tools.tensors.tensor_io import quiet_single_process  # here, not at the top: it imports torch

    files, default_out = _find_safetensors_source(path)
    out = os.fspath(output).rstrip("/") if output is not None else default_out
    for file in files:
        _refuse_inside(file, out, "the input", f"--output {out}, which would be replaced")
    if storage.exists(out) and not overwrite:
        raise OutputExistsError(f"{out} already exists; pass --overwrite to replace it")
    fs, inner_out = storage.resolve(out)
    if fs.exists(inner_out) and not fs.isdir(inner_out):
        raise OutputExistsError(f"{out} is a file, not a DCP directory; --overwrite replaces only DCP files")
    parent, name = out.rsplit("/", 1) if "/" in out else (".", out)
    tmp = layout.join(parent, layout.TMP_PREFIX + name)
    storage.remove_tree(tmp)
    with _mapped_tensors(files) as state:
        try:
            with quiet_single_process():
                dcp.save(state, checkpoint_id=tmp, no_dist=True)
        except BaseException:
            storage.remove_tree(tmp)
            raise
        count, total = len(state), sum(t.numel() * t.element_size() for t in state.values())
    _replace_dcp_files(tmp, out)
    return ConversionResult(files[0], (out,), None, count, total, None, False)


_DCP_FILE = re.compile(r"^(\.metadata|__\d+_\d+\.distcp)$")


def _replace_dcp_files(tmp: str, out: str) -> None:
    """Move a DCP directory written under `tmp` into `out`: a new `out` is one rename; into an
    existing one, only the files DCP writes (`.metadata`, `__<rank>_<i>.distcp`) are replaced, the old
    ones removed first and `.metadata` moved last, so nothing else in `out` is ever touched."""
    fs, inner_tmp = storage.resolve(tmp)
    inner_out = storage.resolve(out)[1]
    local = storage.is_local(fs)
    if not fs.exists(inner_out):
        if local:
            os.rename(inner_tmp, inner_out)
        else:
            storage.move_tree(fs, inner_tmp, inner_out)
        return
    for name in storage.list_names(out):
        if _DCP_FILE.match(name):
            fs.rm(f"{inner_out}/{name}")
    for name in sorted(storage.list_names(tmp), key=lambda n: n == layout.DCP_METADATA):
        if local:
            os.replace(f"{inner_tmp}/{name}", f"{inner_out}/{name}")
        else:
            fs.mv(f"{inner_tmp}/{name}", f"{inner_out}/{name}")
    storage.remove_tree(tmp)


def _find_safetensors_source(path: str | os.PathLike[str]) -> tuple[list[str], str]:
    """(safetensors files to read, default DCP output directory)."""
    text = os.fspath(path).rstrip("/")
    if text.endswith(".safetensors"):
        model_dir, name = text.rsplit("/", 1) if "/" in text else (".", text)
        dcp_name = layout.ADAPTER_DCP_DIR if name == layout.ADAPTER_SAFETENSORS else layout.MODEL_DCP_DIR
        return [text], layout.join(model_dir, dcp_name)
    cat = catalog(text)
    order = ((MODEL, SHARDED_SAFETENSORS), (MODEL, SAFETENSORS), (ADAPTER, SAFETENSORS))
    for role, fmt in order:
        for weights in cat.of_role(role):
            if weights.format != fmt:
                continue
            dcp_name = layout.ADAPTER_DCP_DIR if role == ADAPTER else layout.MODEL_DCP_DIR
            if fmt == SHARDED_SAFETENSORS:
                shards = sorted(set(read_weight_map(weights.path).values()))
                return [layout.join(cat.model_dir, s) for s in shards], layout.join(cat.model_dir, dcp_name)
            return [weights.path], layout.join(cat.model_dir, dcp_name)
    raise NotACheckpointError(
        f"{text} has no {layout.MODEL_SAFETENSORS}, {layout.MODEL_INDEX} or {layout.ADAPTER_SAFETENSORS}"
    )


@contextmanager
def _mapped_tensors(files: list[str]) -> Iterator[dict[str, Any]]:
    """Every tensor of the files as a CPU tensor over a private memory map. A file on a store is first
    streamed to a local temporary file, so memory stays bounded whatever its size. A map is released
    with the last tensor viewing it."""
    import mmap
    import tempfile

    import torch

    state: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="ckpt-convert-") as downloads:
        try:
            for number, file in enumerate(files):
                header = read_safetensors_header(file)
                fs, inner = storage.resolve(file)
                if not storage.is_local(fs):
                    fs.get_file(inner, f"{downloads}/{number}.safetensors")
                    inner = f"{downloads}/{number}.safetensors"
                with open(inner, "rb") as handle:
                    buffer = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
                _view_tensors(header, buffer, state, torch)
            yield state
        finally:
            state.clear()


def _view_tensors(header: Any, buffer: Any, state: dict[str, Any], torch: Any) -> None:
    """Add every tensor of one mapped safetensors file to `state`, as views of the map."""
    for name, info in header.tensors.items():
        count = info.nbytes // ITEMSIZE[info.dtype]
        dtype = _torch_dtype(info.dtype)
        start = header.data_start + info.data_offsets[0]
        flat = (
            torch.frombuffer(buffer, dtype=dtype, count=count, offset=start)
            if count
            else torch.empty(0, dtype=dtype)
        )
        state[name] = flat.reshape(info.shape)
