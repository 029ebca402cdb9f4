"""Filesystem access through fsspec, so a checkpoint reads the same from disk, `memory://` or a bucket.

Local paths stay plain paths for the user; URLs with a protocol go to the matching fsspec filesystem.
"""

from __future__ import annotations

import json
import os
from typing import Any

import fsspec
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

from ckpt_tools.errors import CheckpointNotFoundError, CorruptCheckpointError

# Listings are never cached: on an object store several processes (the ranks of a save, a resumed run)
# write into one prefix, and a listing cached by one would hide another's objects (a commit copying a
# step would then miss a rank's shards).
FSSPEC_OPTIONS: dict[str, Any] = {"use_listings_cache": False}


def resolve(path: str | os.PathLike[str]) -> tuple[fsspec.AbstractFileSystem, str]:
    """Return the filesystem and the path inside it (local paths made absolute).

    A URL's store takes its options (endpoint, credentials) from fsspec's configuration and the
    store's own environment variables, never from the path, so no secret is ever part of a path that
    a checkpoint records."""
    text = os.fspath(path)
    if "://" not in text:
        return url_to_fs(os.path.abspath(os.path.expanduser(text)))
    fs, inner = url_to_fs(text, **FSSPEC_OPTIONS)
    return fs, inner


def exists(path: str | os.PathLike[str]) -> bool:
    fs, inner = resolve(path)
    return bool(fs.exists(inner))


def read_bytes(path: str | os.PathLike[str]) -> bytes:
    fs, inner = resolve(path)
    try:
        with fs.open(inner, "rb") as handle:
            return handle.read()
    except FileNotFoundError as exc:
        raise CheckpointNotFoundError(f"{os.fspath(path)}: no such file") from exc


def read_text(path: str | os.PathLike[str]) -> str:
    return read_bytes(path).decode("utf-8")


def open_file(path: str | os.PathLike[str], mode: str = "rb", **kwargs: Any) -> Any:
    fs, inner = resolve(path)
    return fs.open(inner, mode, **kwargs)


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    """Local disk (a plain path or `file://`): the one store with atomic renames and symlinks."""
    return isinstance(fs, LocalFileSystem)


def list_names(path: str | os.PathLike[str]) -> list[str]:
    """Names of the entries directly inside a directory, sorted; empty when it is not a directory."""
    fs, inner = resolve(path)
    if not fs.isdir(inner):
        return []
    return sorted(entry.rstrip("/").rsplit("/", 1)[-1] for entry in fs.ls(inner, detail=False))


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


def read_json(path: str | os.PathLike[str]) -> Any:
    """A JSON file's value; a file that does not parse is a damaged checkpoint, named as such."""
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise CorruptCheckpointError(
            f"{os.fspath(path)} is not valid JSON ({exc}); the file is damaged"
        ) from exc


def read_json_object(path: str | os.PathLike[str]) -> dict[str, Any]:
    """`read_json` for files whose value must be an object (configs, indexes)."""
    data = read_json(path)
    if not isinstance(data, dict):
        raise CorruptCheckpointError(f"{os.fspath(path)}: expected a JSON object, got {type(data).__name__}")
    return data


def json_bytes(data: Any) -> bytes:
    """JSON the way every checkpoint file holds it: indented, keys sorted, newline-terminated."""
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode("utf-8")


def write_json(path: str | os.PathLike[str], data: Any) -> None:
    write_bytes(path, json_bytes(data))
