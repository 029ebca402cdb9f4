"""A dataset file on an object store read in place: ranged GETs into a bounded per-process block cache.

`--dataset.streaming=true` reads a LeRobotDataset where it lies (`s3://bucket/path`,
`hf://datasets/owner/name`, `file://...`)
instead of downloading it. pyarrow and PyAV both accept a file-like object and read only the byte
ranges they need (a parquet footer and the columns asked for; a video's index and the packets of one
group of pictures), so `RemoteFile` turns each of their reads into at most one GET: the missing
`BLOCK_SIZE` blocks a read spans are fetched together, kept in an LRU bounded by
`--dataset.cache_size`, and served from memory the next time. The cache is per process (each
DataLoader worker has its own, so a run holds at most workers + 1 times the bound), and a cache
copied into another process starts empty.

A GET that fails for a transient reason (a reset connection, a timeout, a 5xx) is retried
(`ATTEMPTS` attempts, `BACKOFF_S` between them) and counted in a counter the DataLoader workers share
(`retry_count`, logged as `stream_retries`); one that still fails, or fails for good (a missing
object, refused credentials), is one `StreamError` line naming the URL and the fix.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from trainer.errors import ConfigError

BLOCK_SIZE = 1 << 20  # bytes per cached block: a parquet column chunk or a few video packets
DEFAULT_CACHE_SIZE = 1 << 30
ATTEMPTS = 4
BACKOFF_S = (0.25, 0.5, 1.0)  # the waits before attempts 2, 3 and 4
_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


class StreamError(ConfigError):
    """A streamed dataset's file cannot be read: the store is unreachable, refuses us or lacks it."""


def unreachable(url: str, exc: BaseException, attempts: int = ATTEMPTS) -> StreamError:
    """The one line for a store that did not answer: the URL, the cause and what to check."""
    cause = " ".join(str(exc).split())[:160] or type(exc).__name__
    tried = f" after {attempts} attempts" if attempts > 1 else ""
    return StreamError(
        f"cannot read {url}{tried} ({type(exc).__name__}: {cause}); check that the store is reachable "
        "(AWS_ENDPOINT_URL or HF_ENDPOINT, network) and that the credentials may read it, or copy the dataset locally "
        "and drop --dataset.streaming"
    )


_RETRIES: Any = None  # the run's shared retry counter (a multiprocessing Value), made before the workers fork


def count_retries() -> None:
    """Make the shared retry counter in this process (the main one, before DataLoader workers start)."""
    global _RETRIES
    if _RETRIES is None:
        _RETRIES = multiprocessing.Value("q", 0)


def retry_count() -> int | None:
    """Retried GETs of this run so far, every worker's included; None when nothing is streamed."""
    return None if _RETRIES is None else int(_RETRIES.value)


def _retried() -> None:
    if _RETRIES is not None:
        with _RETRIES.get_lock():
            _RETRIES.value += 1


@dataclass
class Store:
    """Where a streamed dataset's bytes come from and how much of them a process keeps."""

    cache_size: int = DEFAULT_CACHE_SIZE
    block_size: int = BLOCK_SIZE

    def __post_init__(self) -> None:
        self._cache: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self._held = 0
        self._pid = os.getpid()

    def __getstate__(self) -> dict[str, Any]:
        return {"cache_size": self.cache_size, "block_size": self.block_size}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.cache_size, self.block_size = state["cache_size"], state["block_size"]
        self.__post_init__()

    @property
    def held(self) -> int:
        """Bytes this process's cache holds now (never more than `cache_size`)."""
        return self._held

    def read(self, fs: Any, url: str, inner: str, start: int, end: int) -> bytes:
        """Bytes `[start, end)` of the object: cached blocks from memory, the missing ones in one GET."""
        if self._pid != os.getpid():  # a forked copy: its cache is the parent's, not this process's
            self.__post_init__()
        if end <= start:
            return b""
        first, last = start // self.block_size, (end - 1) // self.block_size
        blocks = {b: self._cache.get((url, b)) for b in range(first, last + 1)}
        missing = [b for b, data in blocks.items() if data is None]
        if missing:
            low, high = missing[0] * self.block_size, (missing[-1] + 1) * self.block_size
            fetched = _get(fs, url, inner, low, high)
            for b in range(missing[0], missing[-1] + 1):
                offset = (b - missing[0]) * self.block_size
                blocks[b] = fetched[offset : offset + self.block_size]
                self._keep((url, b), blocks[b] or b"")
        for b in blocks:
            if (url, b) in self._cache:
                self._cache.move_to_end((url, b))
        joined = b"".join(blocks[b] or b"" for b in range(first, last + 1))
        return joined[start - first * self.block_size : end - first * self.block_size]

    def _keep(self, key: tuple[str, int], data: bytes) -> None:
        if len(data) > self.cache_size:
            return
        previous = self._cache.pop(key, None)
        self._held -= len(previous or b"")
        self._cache[key] = data
        self._held += len(data)
        while self._held > self.cache_size:
            _, oldest = self._cache.popitem(last=False)
            self._held -= len(oldest)


def _get(fs: Any, url: str, inner: str, start: int, end: int) -> bytes:
    """One ranged GET, retried on transient failures (see the module docstring)."""
    for attempt in range(ATTEMPTS):
        try:
            return bytes(fs.cat_file(inner, start=start, end=end, **_exact(fs)))
        except _PERMANENT as exc:
            raise unreachable(url, exc, attempts=1) from None
        except Exception as exc:  # the store's client raises many types for a failed request
            if attempt == ATTEMPTS - 1:
                raise unreachable(url, exc) from None
            _retried()
            time.sleep(BACKOFF_S[attempt])
    raise AssertionError("unreachable")  # the loop returns or raises


def _exact(fs: Any) -> dict[str, str]:
    """`cat_file` options reading exactly the range asked: HfFileSystem reads a range through fsspec's
    buffered file, whose default read-ahead would fetch 5 MiB past it (the blocks here are the cache)."""
    return {"cache_type": "none"} if getattr(fs, "protocol", None) == "hf" else {}


class RemoteFile(io.RawIOBase):
    """A read-only, seekable file over one object, every read served by `Store.read`."""

    def __init__(self, fs: Any, url: str, inner: str, size: int, store: Store) -> None:
        super().__init__()
        self.fs, self.url, self.inner, self.size, self.store = fs, url, inner, size, store
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self.size}[whence]
        self._position = max(0, base + offset)
        return self._position

    def read(self, size: int | None = -1) -> bytes:
        end = self.size if size is None or size < 0 else min(self.size, self._position + size)
        data = self.store.read(self.fs, self.url, self.inner, self._position, end)
        self._position += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)
