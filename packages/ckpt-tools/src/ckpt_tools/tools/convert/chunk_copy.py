"""One tensor of a DCP -> safetensors conversion, copied from its chunks into the writer: a kernel byte
copy when its chunks are row runs of the output in the same dtype (the FSDP case), a block-by-block
cast otherwise, and a tensor split along an inner dimension assembled in memory, one tensor at a time.
torch is imported only for those last two cases. The `.distcp` files stay open a bounded number at a
time."""

from __future__ import annotations

from collections.abc import Callable
from typing import IO, Any

from ckpt_tools.dcp.index import ChunkEntry, TensorEntry
from ckpt_tools.dcp.records import locate_chunk_data
from ckpt_tools.errors import CorruptCheckpointError
from ckpt_tools.files import storage
from ckpt_tools.files.safetensors_writer import COPY_BLOCK, SafetensorsStreamWriter
from ckpt_tools.format import layout
from ckpt_tools.format.dtypes import ITEMSIZE, SAFETENSORS_TO_TORCH

_MAX_OPEN_FILES = 64


class OpenFiles:
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

    def __enter__(self) -> OpenFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._open.values():
            handle.close()


def write_tensor(
    writer: SafetensorsStreamWriter,
    entry: TensorEntry,
    out_dtype: str,
    files: OpenFiles,
    progress: Callable[[int], None],
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
            writer.write(_tensor_bytes(_load_chunk(handle, chunk, where).to(torch_dtype(out_dtype))))
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
        values = torch.frombuffer(raw, dtype=torch_dtype(src)) if raw else torch.empty(0)
        writer.write(_tensor_bytes(values.to(torch_dtype(dst))))


def _assemble(entry: TensorEntry, out_dtype: str, files: OpenFiles) -> Any:
    """A tensor split along an inner dimension, assembled in memory (this tensor only)."""
    import torch

    full = torch.empty(entry.shape, dtype=torch_dtype(out_dtype))
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
    return torch.frombuffer(raw, dtype=torch_dtype(dtype)).reshape(chunk.sizes) if raw else torch.empty(0)


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


def torch_dtype(code: str) -> Any:
    import torch

    return getattr(torch, SAFETENSORS_TO_TORCH[code])


def _tensor_bytes(tensor: Any) -> memoryview:
    import torch

    flat = tensor.detach().contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")
