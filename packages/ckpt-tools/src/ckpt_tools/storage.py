"""Filesystem access through fsspec, so a checkpoint reads the same from disk, `memory://` or a bucket.

Local paths stay plain paths for the user; URLs with a protocol go to the matching fsspec filesystem.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import fsspec
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

from ckpt_tools.errors import CheckpointNotFoundError

if TYPE_CHECKING:
    from ckpt_tools.meta import TrainingStep


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
    fs, inner = resolve(last)
    if is_local(fs) and os.path.islink(inner):
        name = os.readlink(inner).rstrip("/")
        if "://" not in last and not layout.is_step_dir_name(name):
            return os.path.realpath(last)  # a link someone made by hand, to anywhere
    else:
        name = read_text(last).strip()
    if not layout.is_step_dir_name(name):
        from ckpt_tools.errors import CorruptCheckpointError

        raise CorruptCheckpointError(f"{last} names {name!r}, which is not a step directory")
    return layout.join(root, name)


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    """Local disk (a plain path or `file://`): the one store with atomic renames and symlinks."""
    return isinstance(fs, LocalFileSystem)


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


def tmp_step_dir(checkpoints_dir: str | os.PathLike[str], step: int) -> str:
    """Where step `step` is written before it is complete: `checkpoints/.tmp-005000`.

    The name is deterministic so every rank of a collective save computes the same one; readers never
    take a `.tmp-` directory for a step because it does not match `layout.is_step_dir_name`.
    """
    from ckpt_tools import layout

    return layout.join(os.fspath(checkpoints_dir), layout.TMP_PREFIX + layout.step_dir_name(step))


def begin_step_dir(checkpoints_dir: str | os.PathLike[str], step: int) -> str:
    """Create an empty temporary step directory (removing the leftovers of a crashed save of the same
    step) and return its path. Call on the main rank only, before the other ranks write into it."""
    tmp = tmp_step_dir(checkpoints_dir, step)
    remove_tree(tmp)
    makedirs(tmp)
    return tmp


def commit_step_dir(tmp_dir: str, checkpoints_dir: str | os.PathLike[str], step: int) -> str:
    """Rename a complete temporary step directory to its final name, then move `last` to it.

    The order is what makes a crash harmless: until the rename the step does not exist for readers,
    and `last` moves only after the rename. An existing directory of the same step (a save repeated
    after a resume) is set aside first and deleted once `last` has moved. Returns the final path.
    """
    from ckpt_tools import layout

    name = layout.step_dir_name(step)
    final = layout.join(os.fspath(checkpoints_dir), name)
    fs, final_inner = resolve(final)
    old = None
    if fs.exists(final_inner):
        old = layout.join(os.fspath(checkpoints_dir), f"{layout.TMP_PREFIX}old-{name}")
        remove_tree(old)
        _rename_dir(fs, final_inner, resolve(old)[1])
    _rename_dir(fs, resolve(tmp_dir)[1], final_inner)
    point_last(checkpoints_dir, name)
    if old is not None:
        remove_tree(old)
    return final


def _rename_dir(fs: fsspec.AbstractFileSystem, src: str, dst: str) -> None:
    if is_local(fs):
        os.rename(src, dst)  # atomic on one filesystem
    else:
        fs.mv(src, dst, recursive=True)  # object stores have no rename: copy then delete


def point_last(checkpoints_dir: str | os.PathLike[str], step_name: str) -> None:
    """Make `checkpoints/last` name `step_name`, replacing the old pointer in one step.

    On local disk `last` is a relative symlink (`last -> 005000`) created under a temporary name and
    moved over the old one with `os.replace`, so a reader sees either the old or the new target. Stores
    without links get a text file holding the step name (one object write, atomic on object stores).
    """
    from ckpt_tools import layout

    if not layout.is_step_dir_name(step_name):
        raise ValueError(f"{step_name!r} is not a step directory name")
    root = os.fspath(checkpoints_dir).rstrip("/")
    fs, inner_root = resolve(root)
    if not is_local(fs):
        write_text(layout.join(root, layout.LAST), step_name + "\n")
        return
    tmp = os.path.join(inner_root, f"{layout.TMP_PREFIX}{layout.LAST}-{os.getpid()}")
    if os.path.lexists(tmp):
        os.remove(tmp)
    try:
        os.symlink(step_name, tmp)
    except OSError:  # a local filesystem without symlinks: fall back to the text form
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(step_name + "\n")
    os.replace(tmp, os.path.join(inner_root, layout.LAST))


def latest_step_dir(path: str | os.PathLike[str]) -> str | None:
    """The step directory `last` names, given a run's output_dir or its `checkpoints/` directory.

    Returns None when no checkpoint has been committed yet (no `last`), so a trainer can ask before
    the first save without catching errors.
    """
    from ckpt_tools import layout

    root = os.fspath(path).rstrip("/")
    fs, inner = resolve(root)
    if fs.exists(f"{inner}/{layout.CHECKPOINTS_DIR}"):
        root, inner = layout.join(root, layout.CHECKPOINTS_DIR), f"{inner}/{layout.CHECKPOINTS_DIR}"
    last = f"{inner}/{layout.LAST}"
    if not fs.exists(last) and not (is_local(fs) and os.path.islink(last)):
        return None
    return read_last(root)


def read_training_step(path: str | os.PathLike[str]) -> TrainingStep:
    """Read `training_state/training_step.json` of a step directory, `last`, an output_dir or a
    `pretrained_model/` inside a step directory."""
    from ckpt_tools import layout
    from ckpt_tools.errors import NotACheckpointError
    from ckpt_tools.meta import TrainingStep

    step_dir, _ = resolve_model_dir(path)
    if step_dir is None:
        raise NotACheckpointError(
            f"{os.fspath(path)} is a model directory without training_state/; pass a step directory "
            "(checkpoints/005000) or checkpoints/last"
        )
    source = layout.join(step_dir, layout.TRAINING_STATE_DIR, layout.TRAINING_STEP)
    return TrainingStep.from_json(read_bytes(source), source=source)
