"""Sizes and sha256 digests of the files a save writes, computed from the bytes as they are written
(never by reading the files back), for the step's integrity manifest (`manifest.py`)."""

from __future__ import annotations

import hashlib
import threading
from typing import Any


class Recorder:
    """Collects `path -> (size, sha256 hex)` for the files one rank writes; safe across the writer
    threads of a DCP save."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files: dict[str, tuple[int, str]] = {}

    def record_bytes(self, path: str, data: bytes | memoryview) -> None:
        self.record(path, len(data), hashlib.sha256(data).hexdigest())

    def record(self, path: str, size: int, sha256: str) -> None:
        with self._lock:
            self._files[path] = (size, sha256)

    def rename(self, old: str, new: str) -> None:
        with self._lock:
            if old in self._files:
                self._files[new] = self._files.pop(old)

    def entries(self) -> dict[str, tuple[int, str]]:
        with self._lock:
            return dict(self._files)


class HashingStream:
    """A binary write stream that hashes what passes through it and records it on close."""

    def __init__(self, raw: Any, path: str, recorder: Recorder) -> None:
        self._raw, self._path, self._recorder = raw, path, recorder
        self._hash = hashlib.sha256()
        self._size = 0
        self._recorded = False

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._hash.update(view)
        self._size += view.nbytes
        return self._raw.write(data)

    def finish(self) -> None:
        """Record the file (once): what was written so far is all of it."""
        if not self._recorded:
            self._recorder.record(self._path, self._size, self._hash.hexdigest())
            self._recorded = True

    def close(self) -> None:
        self.finish()
        self._raw.close()

    def __enter__(self) -> HashingStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:  # tell, flush, fileno, seekable, ... of the real stream
        return getattr(self._raw, name)


class HashingFileSystem:
    """Wraps the filesystem object of a torch DCP writer: every stream it opens for writing hashes
    its bytes into `recorder`, and its renames (`.metadata.tmp` -> `.metadata`) carry the record."""

    def __init__(self, inner: Any, recorder: Recorder) -> None:
        self._inner, self._recorder = inner, recorder

    def create_stream(self, path: Any, mode: str) -> Any:
        from contextlib import contextmanager

        @contextmanager
        def opened() -> Any:
            with self._inner.create_stream(path, mode) as stream:
                if "w" not in mode:
                    yield stream
                    return
                hashing = HashingStream(stream, str(path), self._recorder)
                try:
                    yield hashing
                finally:
                    hashing.finish()

        return opened()

    def rename(self, path: Any, new_path: Any) -> None:
        self._inner.rename(path, new_path)
        self._recorder.rename(str(path), str(new_path))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
