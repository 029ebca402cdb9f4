"""Filesystem access through fsspec, so a checkpoint reads the same from disk, `memory://` or a bucket.

Local paths stay plain paths for the user; URLs with a protocol go to the matching fsspec filesystem.
"""

from __future__ import annotations

import os
from typing import Any

import fsspec
from fsspec.core import url_to_fs

from ckpt_tools.errors import CheckpointNotFoundError


def resolve(path: str | os.PathLike[str]) -> tuple[fsspec.AbstractFileSystem, str]:
    """Return the filesystem and the path inside it (local paths made absolute)."""
    text = os.fspath(path)
    if "://" not in text:
        text = os.path.abspath(os.path.expanduser(text))
    fs, inner = url_to_fs(text)
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
