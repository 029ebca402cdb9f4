"""A streaming safetensors writer: the header from names, dtypes and shapes alone, then the bytes in order.

The safetensors library's `save_file` needs every tensor in memory at once. Conversion knows the whole
header before reading any data (DCP metadata gives shapes and dtypes), so it writes the header first and
then each tensor's bytes front to back, straight from the source file when the bytes need no change
(`os.copy_file_range`: the kernel copies, nothing passes through Python). Peak memory is one buffer.

The file is written under a `.tmp-` name; `commit()` renames it into place after the caller checked it.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, Any, cast

from ckpt_tools.errors import CorruptCheckpointError
from ckpt_tools.files import storage
from ckpt_tools.files.digest import HashingStream, Recorder
from ckpt_tools.format import layout
from ckpt_tools.format.dtypes import ITEMSIZE, nbytes

METADATA_KEY = "__metadata__"
COPY_BLOCK = storage.COPY_BLOCK  # Python-buffered copies (a store on either side) go in these pieces


@dataclass(frozen=True)
class TensorSpec:
    """What the header says about one tensor."""

    name: str
    dtype: str  # safetensors code
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return nbytes(self.dtype, self.shape)


def aligned_order(specs: Sequence[TensorSpec]) -> list[TensorSpec]:
    """Widest dtype first, then by name: every tensor starts at a multiple of its item size (what the
    safetensors library does too), so readers can map the file without copies."""
    return sorted(specs, key=lambda s: (-ITEMSIZE[s.dtype], s.name))


def build_header(specs: Sequence[TensorSpec], metadata: dict[str, str] | None = None) -> bytes:
    """The 8-byte length prefix and the JSON header, space-padded to 8 bytes, for tensors in `specs`
    order, back to back without holes."""
    header: dict[str, Any] = {}
    if metadata:
        header[METADATA_KEY] = dict(metadata)
    offset = 0
    for spec in specs:
        header[spec.name] = {
            "dtype": spec.dtype,
            "shape": list(spec.shape),
            "data_offsets": [offset, offset + spec.nbytes],
        }
        offset += spec.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


class SafetensorsStreamWriter:
    """Writes one safetensors file front to back under a temporary name.

    Call `write` / `copy_from` with each tensor's bytes in `specs` order (the order given is the file
    order; use `aligned_order`), then `close()`, then `commit()` once the caller is satisfied. With a
    `recorder`, the file's size and sha256 are recorded under its final name as it is written.
    """

    def __init__(
        self,
        path: str,
        specs: Sequence[TensorSpec],
        metadata: dict[str, str] | None = None,
        recorder: Recorder | None = None,
    ):
        self.path = path.rstrip("/")
        parent, name = layout.parent(self.path), layout.name(self.path)
        self.tmp_path = layout.join(parent, layout.TMP_PREFIX + name)
        self.specs = list(specs)
        header = build_header(self.specs, metadata)
        self.expected_size = len(header) + sum(s.nbytes for s in self.specs)
        self._fs, inner = storage.resolve(self.tmp_path)
        self._fs.makedirs(layout.parent(inner), exist_ok=True)
        self._handle: IO[bytes] = storage.open_file(self.tmp_path, "wb")
        if recorder is not None:  # the digest under the final name, from the bytes as they pass
            self._handle = cast("IO[bytes]", HashingStream(self._handle, self.path, recorder))
        self._written = 0
        self._kernel_copy = storage.is_local(self._fs) and recorder is None  # a kernel copy is not hashed
        self._put(header)

    def write(self, data: Any) -> None:
        """Append bytes (anything exposing the buffer protocol)."""
        self._put(data)

    def copy_from(self, source: IO[bytes], offset: int, length: int) -> None:
        """Append `length` bytes of an open source file starting at `offset`, without Python buffers
        when both files are local."""
        if self._kernel_copy and self._copy_in_kernel(source, offset, length):
            return
        source.seek(offset)
        left = length
        while left:
            block = source.read(min(COPY_BLOCK, left))
            if not block:
                raise CorruptCheckpointError(f"{getattr(source, 'name', 'source')} ended early")
            self._put(block)
            left -= len(block)

    def _copy_in_kernel(self, source: IO[bytes], offset: int, length: int) -> bool:
        try:
            src_fd, dst_fd = source.fileno(), self._handle.fileno()
        except (AttributeError, OSError, ValueError):
            return False
        self._handle.flush()
        done = 0
        try:
            while done < length:
                copied = os.copy_file_range(src_fd, dst_fd, length - done, offset + done)
                if copied == 0:
                    raise CorruptCheckpointError(f"{getattr(source, 'name', 'source')} ended early")
                done += copied
        except OSError:
            if done:
                raise
            self._kernel_copy = False  # e.g. a kernel or filesystem without copy_file_range
            return False
        self._written += length
        self._handle.seek(0, os.SEEK_END)
        return True

    def _put(self, data: Any) -> None:
        self._written += self._handle.write(data)

    def close(self) -> None:
        """Finish the temporary file; raises if the bytes written do not match the header."""
        self._handle.close()
        if self._written != self.expected_size:
            raise CorruptCheckpointError(
                f"{self.path}: wrote {self._written} bytes, the header needs {self.expected_size}"
            )

    def commit(self) -> None:
        """Move the finished file to its final name (atomic on local disk)."""
        _, final = storage.resolve(self.path)
        _, tmp = storage.resolve(self.tmp_path)
        if storage.is_local(self._fs):
            os.replace(tmp, final)
        else:
            self._fs.mv(tmp, final)

    def discard(self) -> None:
        """Remove the temporary file (after a failure); never touches the final name."""
        if not self._handle.closed:
            with contextlib.suppress(OSError):  # a full disk fails the flush too; remove the file anyway
                self._handle.close()
        _, tmp = storage.resolve(self.tmp_path)
        if self._fs.exists(tmp):
            self._fs.rm(tmp)
