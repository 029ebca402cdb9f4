"""Filesystem access through fsspec, so a checkpoint reads the same from disk, `memory://` or a bucket.

Local paths stay plain paths for the user; URLs with a protocol go to the matching fsspec filesystem.
fsspec is imported only for a URL or a write: the read helpers (`exists`, `is_dir`, `is_file`, `size`,
`list_names`, `list_files`, `read_bytes`, `open_regular`, `contained`, `check_links`) answer a plain
local path with `os`, so `ckpt inspect` on a local checkpoint never pays fsspec's import (a quarter of
the command). A `file://` URL goes through fsspec as before and is local disk for every check.
A checkpoint's files are untrusted input (`untrusted`): `read_bytes` and `open_regular` read only
regular files (a FIFO would block forever, a link to `/dev/zero` read until memory runs out), JSON is
read under a size limit and parsed into one-line errors, and `contained` keeps a file name that a
checkpoint stores (a DCP record's path, an index entry) inside the directory that names it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import threading
from collections.abc import Callable, Iterator
from typing import IO, TYPE_CHECKING, Any, TypeVar

from ckpt_tools.errors import CheckpointNotFoundError, CorruptCheckpointError
from ckpt_tools.format import layout
from ckpt_tools.format.untrusted import MAX_CONFIG_BYTES, MAX_JSON_BYTES, describe, parse_json

if TYPE_CHECKING:
    import fsspec

T = TypeVar("T")

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)

# Listings are never cached: on an object store several processes (the ranks of a save, a resumed run)
# write into one prefix, and a listing cached by one would hide another's objects (a commit copying a
# step would then miss a rank's shards).
FSSPEC_OPTIONS: dict[str, Any] = {"use_listings_cache": False}


def resolve(path: str | os.PathLike[str]) -> tuple[fsspec.AbstractFileSystem, str]:
    """Return the filesystem and the path inside it (local paths made absolute).

    A URL's store takes its options (endpoint, credentials) from fsspec's configuration and the
    store's own environment variables, never from the path, so no secret is ever part of a path that
    a checkpoint records."""
    from fsspec.core import url_to_fs

    text = os.fspath(path)
    fs: fsspec.AbstractFileSystem
    inner: str
    if not layout.is_url(text):
        fs, inner = url_to_fs(absolute(text))
        return fs, inner
    fs, inner = url_to_fs(text, **FSSPEC_OPTIONS, **_environment_options(text))
    listing = getattr(_LISTED, "root", None)
    if listing is not None and (inner == listing[1] or inner.startswith(listing[1] + "/")):
        return listing[0], inner
    return fs, inner


def _environment_options(url: str) -> dict[str, Any]:
    """The options a store takes from its environment that its client reads too early: huggingface_hub
    reads HF_ENDPOINT once, when it is imported, so an `hf://` URL gets it as read now (as the Hub
    pushes do), and a test's loopback Hub or a user's mirror set later still applies."""
    endpoint = os.environ.get("HF_ENDPOINT")
    return {"endpoint": endpoint} if url.startswith("hf://") and endpoint else {}


_LISTED = threading.local()  # .root: (client with a listing cache, the listed path), inside `listed`
_LISTING_LOCK = threading.Lock()  # one listed walk at a time: they share that client


@contextlib.contextmanager
def listed(root: str | os.PathLike[str]) -> Iterator[None]:
    """Answer the existence, type and size questions about paths under `root` on an object store from
    one listing of everything below it, taken on entry, instead of a request each. For read-only walks
    (verifying a step asks about some twenty files): a write inside the block, or by another process
    meanwhile, is not seen. Local paths, and a block nested in another, read as they are."""
    if local_path(root) is not None or getattr(_LISTED, "root", None) is not None:
        yield
        return
    from fsspec.core import url_to_fs

    _, inner = resolve(root)
    with _LISTING_LOCK:
        options = _environment_options(os.fspath(root))
        cached, _ = url_to_fs(os.fspath(root), use_listings_cache=True, listings_expiry_time=None, **options)
        cached.invalidate_cache()
        try:
            cached.find(inner, withdirs=True)  # fills the client's cache with every directory below
            _LISTED.root = (cached, inner.rstrip("/"))
            yield
        finally:
            _LISTED.root = None
            cached.invalidate_cache()


def absolute(path: str | os.PathLike[str]) -> str:
    """A local path as `resolve` names it inside the local filesystem: `~` expanded, made absolute."""
    return os.path.abspath(os.path.expanduser(os.fspath(path)))


def local_path(path: str | os.PathLike[str]) -> str | None:
    """Where `path` lies on local disk, or None for a store. A plain path is answered without fsspec;
    a `file://` URL is resolved by fsspec, as every local check (`contained`, links) must apply to it."""
    text = os.fspath(path)
    if not layout.is_url(text):
        return absolute(text)
    fs, inner = resolve(text)
    return inner if is_local(fs) else None


def _ask(path: str | os.PathLike[str], local: Callable[[str], T], method: str) -> T:
    """One question about a path, asked of `os` on local disk (fsspec's local answers are `os.path`'s)
    and of the store's filesystem (its `method`) otherwise."""
    inner = local_path(path)
    if inner is not None:
        return local(inner)
    fs, store_path = resolve(path)
    answer: T = getattr(fs, method)(store_path)
    return answer


def exists(path: str | os.PathLike[str]) -> bool:
    """Whether anything is there (a dangling local link is not)."""
    return bool(_ask(path, os.path.exists, "exists"))


def lexists(path: str | os.PathLike[str]) -> bool:
    """`exists`, counting a local link even when it leads nowhere (a broken `last` is still a pointer)."""
    local = local_path(path)
    return os.path.lexists(local) if local is not None else exists(path)


def is_link(path: str | os.PathLike[str]) -> bool:
    """A local symlink; never on a store (stores have no links)."""
    local = local_path(path)
    return local is not None and os.path.islink(local)


def is_dir(path: str | os.PathLike[str]) -> bool:
    return bool(_ask(path, os.path.isdir, "isdir"))


def is_file(path: str | os.PathLike[str]) -> bool:
    return bool(_ask(path, os.path.isfile, "isfile"))


def size(path: str | os.PathLike[str]) -> int:
    """A file's size in bytes (a local link's target's)."""
    return int(_ask(path, os.path.getsize, "size"))


def list_files(path: str | os.PathLike[str]) -> dict[str, int | None]:
    """The entries directly inside a directory: name -> size of a regular file, None for anything
    else (a subdirectory, a link, a FIFO), as fsspec's detailed listing types them."""
    local = local_path(path)
    if local is not None:
        with os.scandir(local) as entries:
            return {e.name: e.stat().st_size if e.is_file(follow_symlinks=False) else None for e in entries}
    fs, inner = resolve(path)
    listed = fs.ls(inner, detail=True)
    return {
        layout.name(e["name"]): int(e.get("size") or 0) if e.get("type") == "file" else None for e in listed
    }


def read_bytes(path: str | os.PathLike[str], limit: int | None = None) -> bytes:
    """The whole content of a regular file; more than `limit` bytes (when given) is refused."""
    label = os.fspath(path)
    with open_regular(label) as handle:
        data = handle.read() if limit is None else _read_at_most(handle, limit + 1)
    if limit is not None and len(data) > limit:
        raise CorruptCheckpointError(
            f"{label} is larger than {limit} bytes, more than a checkpoint writes there"
        )
    return data


def _read_at_most(handle: IO[bytes], size: int) -> bytes:
    """Up to `size` bytes, read in pieces: `read(size)` allocates `size` bytes before reading, so a
    512 MiB limit on a 2 kB `.metadata` would cost 512 MiB (a MemoryError under a memory limit)."""
    pieces, left = [], size
    while left > 0 and (piece := handle.read(min(left, COPY_BLOCK))):
        pieces.append(piece)
        left -= len(piece)
    return b"".join(pieces)


def open_regular(path: str | os.PathLike[str]) -> IO[bytes]:
    """Open a file for reading only when it is a regular file (a link to one is fine).

    A local file is opened non-blocking and checked on the open descriptor, so a FIFO swapped in after
    a check still cannot block. Raises CheckpointNotFoundError for a missing file and
    CorruptCheckpointError for anything that is not a regular file.
    """
    label = os.fspath(path)
    inner = local_path(label)
    if inner is None:
        fs, store_path = resolve(label)
        try:
            kind = fs.info(store_path).get("type")
        except FileNotFoundError:
            raise CheckpointNotFoundError(f"{label}: no such file") from None
        if kind != "file":
            raise _not_regular(label, "a directory" if kind == "directory" else f"of type {kind}")
        handle: IO[bytes] = open_file(label, "rb")
        return handle
    try:
        fd = os.open(inner, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise CheckpointNotFoundError(f"{label}: no such file") from None
    except IsADirectoryError:
        raise _not_regular(label, "a directory") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise _not_regular(label, next((name for test, name in _KINDS if test(mode)), "not a regular file"))
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def _not_regular(label: str, kind: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(
        f"{label} is {kind}, not a regular file: refused (a checkpoint holds only regular files)"
    )


def contained(root: str, name: Any, what: str) -> str:
    """`root/name` for a file name stored inside a checkpoint, refused unless it stays inside `root`.

    The name must be a relative path without `..` (no absolute path, no URL, no NUL); on local disk
    the joined path must also resolve, after every symlink, to a place inside `root`'s own resolved
    path. `what` says who named the file (`the record of 'w'`). Raises CorruptCheckpointError.
    """
    if not isinstance(name, str) or not name:
        raise CorruptCheckpointError(f"{root}: {what} names {describe(name)} instead of a file name")
    parts = name.replace("\\", "/").split("/")
    if name.startswith(("/", "\\")) or "://" in name or "\x00" in name or ".." in parts or ":" in parts[0]:
        raise CorruptCheckpointError(
            f"{root}: {what} names {describe(name)}, outside its directory: refused (a checkpoint names "
            "only files inside itself)"
        )
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: no file can have that name, and printing it fails
        raise CorruptCheckpointError(
            f"{root}: {what} names {describe(name)}, which is not valid text for a file name; the file is damaged"
        ) from None
    path = f"{root.rstrip('/')}/{name}"
    inner = local_path(path)
    if inner is not None:
        base = os.path.realpath(local_path(root) or root)
        if os.path.commonpath([base, os.path.realpath(inner)]) != base:
            raise CorruptCheckpointError(
                f"{root}: {what} names {describe(name)}, which is a link leading outside the directory: "
                "refused (a checkpoint names only files inside itself)"
            )
    return path


# A huggingface_hub cache snapshot: its files are links into the same repo's `blobs/`, followed.
_HUB_SNAPSHOT = re.compile(r"^(?P<repo>.+/(?:models|datasets|spaces)--[^/]+--[^/]+)/snapshots/[^/]+$")
_LINK_WALK_DEPTH = 4  # a step directory is 3 deep (step/training_state/optimizer_0/file)
_LINK_WALK_ENTRIES = 200_000


def check_links(root: str | os.PathLike[str]) -> None:
    """Refuse a local step or model directory holding a file or directory that resolves outside it
    (a symlink to elsewhere), before any reader opens one: `inspect`, `verify`, `diff`, the loaders,
    resume and `push` would otherwise read, or upload, a file the checkpoint does not hold. Inside a
    Hugging Face cache snapshot (`.../models--ns--name/snapshots/<rev>/`) links into the same repo's
    `blobs/` are how the cache stores files, and are followed. Stores have no links; nothing to do.
    The walk stops at a step directory's depth, so a stray `ckpt inspect ~` stays quick."""
    inner = local_path(root)
    if inner is None or not os.path.isdir(inner):
        return
    base = os.path.realpath(inner)
    hub = _HUB_SNAPSHOT.match(base)
    allowed = [base, *([os.path.join(hub["repo"], "blobs")] if hub else [])]
    seen = 0
    for directory, dirs, files in os.walk(base):  # a directory link is listed, never descended
        if directory[len(base) :].count(os.sep) >= _LINK_WALK_DEPTH:
            dirs.clear()
        for name in (*dirs, *files):
            seen += 1
            path = os.path.join(directory, name)
            if os.path.islink(path) and not any(_within(os.path.realpath(path), a) for a in allowed):
                raise CorruptCheckpointError(
                    f"{os.fspath(root)}: {describe(os.path.relpath(path, base))} is a link leading outside the "
                    "directory: refused (a checkpoint holds only its own files); copy the file in its place "
                    "(cp --dereference)"
                )
        if seen > _LINK_WALK_ENTRIES:
            return


def _within(path: str, base: str) -> bool:
    return os.path.commonpath([base, path]) == base


def read_text(path: str | os.PathLike[str]) -> str:
    return read_bytes(path).decode("utf-8")


# What a file streamed to or from a store holds in memory. s3fs's default block (50 MB) is both the
# read-ahead of a file open for reading and the part buffered before each upload, per open file.
# Writing: 8 MiB parts (S3's minimum part is 5 MiB; fewer, larger parts upload faster).
# Reading: a 1 MiB read-ahead, which still serves the many small header and record reads from one
# request, and copies in 1 MiB pieces: s3fs keeps each read plus the read-ahead beyond it cached, so
# 8 MiB copy reads cost 16 MiB per open file (a conversion holds every shard file open), and each
# piece is copied again into the upload buffer (`benchmarks/bench_bucket.py`).
STREAM_BLOCK = 8 * 2**20
READ_AHEAD = 2**20
COPY_BLOCK = 2**20
# A whole-file copy (`open_sequential`) reads pieces of this size, one request each: a 1 MiB read-ahead
# made a push 2x slower than 8 MiB reads, and 4 MiB without read-ahead cost less memory than either.
SEQUENTIAL_PIECE = 4 * 2**20


def open_file(path: str | os.PathLike[str], mode: str = "rb", **kwargs: Any) -> Any:
    """Open a file; on a store, with `STREAM_BLOCK` as the upload part of a file written and
    `READ_AHEAD` as the read-ahead of a file read (instead of s3fs's 50 MB for either)."""
    fs, inner = resolve(path)
    if not is_local(fs):
        kwargs.setdefault("block_size", READ_AHEAD if "r" in mode else STREAM_BLOCK)
    return fs.open(inner, mode, **kwargs)


def open_sequential(path: str | os.PathLike[str]) -> Any:
    """Open a file to read once front to back in `SEQUENTIAL_PIECE` reads (a whole-file copy): on a
    store without a read-ahead cache, so each read is one ranged request and holds only the piece read."""
    fs, inner = resolve(path)
    return fs.open(inner, "rb") if is_local(fs) else fs.open(inner, "rb", cache_type="none")


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    """Local disk (a plain path or `file://`): the one store with atomic renames and symlinks."""
    from fsspec.implementations.local import LocalFileSystem  # loaded with `fs`'s own fsspec

    return isinstance(fs, LocalFileSystem)


def list_names(path: str | os.PathLike[str]) -> list[str]:
    """Names of the entries directly inside a directory, sorted; empty when it is not a directory."""
    local = local_path(path)
    if local is not None:
        return sorted(os.listdir(local)) if os.path.isdir(local) else []
    fs, inner = resolve(path)
    if not fs.isdir(inner):
        return []
    return sorted(layout.name(entry) for entry in fs.ls(inner, detail=False))


def makedirs(path: str | os.PathLike[str]) -> None:
    fs, inner = resolve(path)
    fs.makedirs(inner, exist_ok=True)


def write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write a whole file, creating its directory (one object write on object stores)."""
    fs, inner = resolve(path)
    fs.makedirs(fs._parent(inner), exist_ok=True)
    fs.pipe_file(inner, data)


def write_text(path: str | os.PathLike[str], text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def remove_tree(path: str | os.PathLike[str]) -> None:
    """Delete a directory and everything below it; a missing path is not an error."""
    fs, inner = resolve(path)
    if fs.exists(inner):
        fs.rm(inner, recursive=True)


def move_tree(fs: fsspec.AbstractFileSystem, src: str, dst: str, *, last: str | None = None) -> None:
    """Move a directory on a store without a rename (object stores): copy every file, then delete the
    sources. The copies run inside the store (no data passes through this process). Files whose path
    ends with `last` are copied after all others and deleted before them, so their presence can mark a
    complete directory. (fsspec's recursive `mv` cannot serve: on s3fs it tries to copy the directory
    entries themselves, which are not objects, and fails.)"""
    files = fs.find(src, detail=False)
    markers = [name for name in files if last is not None and name.endswith(last)]
    rest = [name for name in files if name not in markers]
    for batch in (rest, markers):
        if batch:
            fs.copy(batch, [dst + name[len(src) :] for name in batch])
    for batch in (markers, rest):
        if batch:
            fs.rm(batch)
    if fs.exists(src):  # the empty directory entries of stores that keep them (memory://)
        fs.rm(src, recursive=True)


def read_json(path: str | os.PathLike[str], limit: int = MAX_JSON_BYTES) -> Any:
    """A JSON file's value; a file that does not parse (or nests too deeply, holds a 5,000-digit
    integer, is not a regular file, is over `limit`) is a damaged checkpoint, named as such. Files of
    a config's size pass `MAX_CONFIG_BYTES`: a 150 MB "config" is refused, not parsed into gigabytes."""
    return parse_json(read_bytes(path, limit), os.fspath(path))


def read_json_object(path: str | os.PathLike[str], limit: int = MAX_JSON_BYTES) -> dict[str, Any]:
    """`read_json` for files whose value must be an object (configs, indexes)."""
    data = read_json(path, limit)
    if not isinstance(data, dict):
        raise CorruptCheckpointError(f"{os.fspath(path)}: expected a JSON object, got {describe(data)}")
    return data


def read_config_json(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A config file (`train_config.json`, `config.json`) as the untrusted input it is: a JSON object
    under `MAX_CONFIG_BYTES`, every failure one CorruptCheckpointError line (what a resume or a
    `--policy.path` reads before it trusts any field)."""
    return read_json_object(path, MAX_CONFIG_BYTES)


def json_bytes(data: Any) -> bytes:
    """JSON the way every checkpoint file holds it: indented, keys sorted, newline-terminated."""
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode("utf-8")


def write_json(path: str | os.PathLike[str], data: Any) -> None:
    write_bytes(path, json_bytes(data))
