"""The run's own files beside its checkpoints (metrics.jsonl, loss_curve.png), on local disk or on any
fsspec store (`s3://bucket/run`), where the checkpoints go too."""

from __future__ import annotations

import os

import fsspec
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

from ckpt_tools import layout


def resolve(path: str | os.PathLike[str]) -> tuple[fsspec.AbstractFileSystem, str]:
    """The store and the path inside it. Listings are not cached: other processes (the next segment of
    a run, ckpt-tools' commit) write into the same prefix."""
    text = os.fspath(path)
    if not layout.is_url(text):
        return url_to_fs(os.path.abspath(text))
    return url_to_fs(text, use_listings_cache=False)


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    return isinstance(fs, LocalFileSystem)


def read_text(path: str | os.PathLike[str]) -> str:
    """The file's text; empty when it does not exist yet."""
    fs, inner = resolve(path)
    return fs.cat_file(inner).decode("utf-8") if fs.isfile(inner) else ""


def write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write a whole file (one object on a store)."""
    fs, inner = resolve(path)
    fs.pipe_file(inner, data)
