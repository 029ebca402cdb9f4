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


def resolve_model_dir(path: str | os.PathLike[str]) -> tuple[str | None, str]:
    """Accept a step directory, `checkpoints/last`, a run's output_dir or a `pretrained_model/`.

    Returns `(step_dir, pretrained_model_dir)`; `step_dir` is None for a bare model directory
    (a converted or downloaded one). Raises `CheckpointNotFoundError` for a missing path.
    """
    from ckpt_tools import layout

    text = os.fspath(path).rstrip("/")
    fs, inner = resolve(text)
    if not fs.exists(inner):
        raise CheckpointNotFoundError(f"{text}: no such file or directory")
    base = text if "://" in text else inner
    if fs.exists(f"{inner}/{layout.CHECKPOINTS_DIR}/{layout.LAST}"):
        base = read_last(layout.join(base, layout.CHECKPOINTS_DIR))
        inner = resolve(base)[1]
    elif inner.rsplit("/", 1)[-1] == layout.LAST:
        base = read_last(base.rsplit("/", 1)[0])
        inner = resolve(base)[1]
    if inner.rsplit("/", 1)[-1] == layout.PRETRAINED_MODEL_DIR:
        return base.rsplit("/", 1)[0], base
    if fs.isdir(f"{inner}/{layout.PRETRAINED_MODEL_DIR}"):
        return base, layout.join(base, layout.PRETRAINED_MODEL_DIR)
    return None, base


def read_last(checkpoints_dir: str | os.PathLike[str]) -> str:
    """Path of the step that `checkpoints/last` names: a relative symlink, or a text file on stores
    without links."""
    from ckpt_tools import layout

    root = os.fspath(checkpoints_dir).rstrip("/")
    last = layout.join(root, layout.LAST)
    if "://" not in last and os.path.islink(last):
        return os.path.realpath(last)
    name = read_text(last).strip()
    if not layout.is_step_dir_name(name):
        from ckpt_tools.errors import CorruptCheckpointError

        raise CorruptCheckpointError(f"{last} names {name!r}, which is not a step directory")
    return layout.join(root, name)
