"""The step commit and the pointers: how a step becomes visible to readers, and how readers find the
newest complete step (`last`) or the best-scored one (`best`, moved by files/scores.py).

A step is written under `checkpoints/.tmp-<step>/`, renamed to its final name when complete, and only
then does `last` move to it (docs/format.md). Whether a step is complete is not decided here: the
caller passes that check (`is_complete`), so this module needs nothing above plain storage. Both
pointers have one form and one set of reader checks (`read_pointer`, `point`); `read_last` and
`point_last` are the `last` pointer's.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from ckpt_tools.errors import CheckpointError, CheckpointNotFoundError, CorruptCheckpointError
from ckpt_tools.files.storage import (
    contained,
    exists,
    is_dir,
    is_link,
    is_local,
    lexists,
    list_names,
    local_path,
    makedirs,
    move_tree,
    read_bytes,
    remove_tree,
    resolve,
    write_text,
)
from ckpt_tools.format import layout
from ckpt_tools.format.untrusted import MAX_POINTER_BYTES, describe

if TYPE_CHECKING:
    import fsspec


def follow_pointers(path: str | os.PathLike[str]) -> str:
    """`path` with the pointer it goes through (`last` or `best`) replaced by the step it names.

    An output_dir (holding `checkpoints/last`) and a `checkpoints/` directory become the step `last`
    names; a path ending in `last` or `best`, or going through one (`checkpoints/best/pretrained_model`),
    has the pointer replaced, so every reader gets `read_pointer`'s checks. Any other path comes back
    unchanged (a directory link that happens to be called `last`, `/mnt/last/run/...`, is no pointer).
    """
    text = os.fspath(path).rstrip("/")
    for root in (layout.join(text, layout.CHECKPOINTS_DIR), text):
        if has_last(root):
            return read_last(root)
    parts = text.split("/")
    for i in range(1, len(parts)):
        root = "/".join(parts[:i])
        inside = i == len(parts) - 1 or parts[i - 1] == layout.CHECKPOINTS_DIR  # not `/mnt/last/...`
        if parts[i] in layout.POINTERS and root and inside and has_pointer(root, parts[i]):
            return layout.join(read_pointer(root, parts[i]), *parts[i + 1 :])
    return text


def has_last(checkpoints_dir: str | os.PathLike[str]) -> bool:
    """Whether `checkpoints_dir` holds an entry named `last`, whatever it is (a link, even a dangling
    one, a text file, a directory, a FIFO): anything there is a pointer for `read_last` to accept or
    refuse, never "no checkpoint yet", so a broken `last` cannot start a fresh run over the old steps."""
    return has_pointer(checkpoints_dir, layout.LAST)


def has_pointer(checkpoints_dir: str | os.PathLike[str], pointer: str) -> bool:
    """Whether `checkpoints_dir` holds an entry named `pointer`, whatever it is (see `has_last`)."""
    return lexists(layout.join(os.fspath(checkpoints_dir), pointer))


def read_last(checkpoints_dir: str | os.PathLike[str]) -> str:
    """Path of the step that `checkpoints/last` names (`read_pointer`)."""
    return read_pointer(checkpoints_dir, layout.LAST)


def read_pointer(checkpoints_dir: str | os.PathLike[str], pointer: str) -> str:
    """Path of the step that `checkpoints/<pointer>` (`last`, `best`) names: a relative symlink, or a
    text file on stores without links.

    Readers follow a pointer only to an existing step directory directly inside `checkpoints_dir`:
    a pointer to a `.tmp-` directory (a save in progress), a hand-made link leaving the directory
    (`last -> /etc`, `last -> ../other/000005`), a step directory that is itself a link leading out of
    `checkpoints_dir`, or a missing step raises `CorruptCheckpointError`.
    """
    root = os.fspath(checkpoints_dir).rstrip("/")
    last = layout.join(root, pointer)
    link = local_path(last) if is_link(last) else None
    if link is not None:
        name = _link_step_name(link)
    elif is_dir(last):
        raise CorruptCheckpointError(
            f"{last} is a directory, not a pointer (copied with links followed?); pass a step directory, "
            f"or replace it with a link: ln -sfn <step, e.g. 005000> {last}"
        )
    else:
        name = _pointer_text(last)
    if not layout.is_step_dir_name(name):
        raise CorruptCheckpointError(
            f"{last} points to {describe(name)}, which is not a step directory inside {root}; readers follow it "
            f"only to a complete step beside it: repoint it (ln -sfn <step, e.g. 005000> {last})"
        )
    step = contained(root, name, f"{pointer} (through the step directory)")  # a link out is refused
    if not is_dir(step):
        raise CorruptCheckpointError(
            f"{last} names {name}, which does not exist; repoint it at a complete step "
            f"(ln -sfn <step> {last}) or pass a step directory"
        )
    return step


def _pointer_text(last: str) -> str:
    """The step name the text form of `last` holds, read under `MAX_POINTER_BYTES` (a FIFO, a device
    or a huge file there is refused, never read), as one line naming the fix."""
    fix = f"replace it with a link to a complete step: ln -sfn <step, e.g. 005000> {last}"
    try:
        data = read_bytes(last, MAX_POINTER_BYTES)
    except CheckpointNotFoundError:
        raise CorruptCheckpointError(f"{last} vanished while it was read; {fix}") from None
    except CorruptCheckpointError as exc:
        detail = str(exc).removeprefix(f"{last} ")  # "is a FIFO, not a regular file: refused (...)"
        raise CorruptCheckpointError(f"{last} {detail}, not a pointer to a step; {fix}") from None
    try:
        return data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise CorruptCheckpointError(
            f"{last} holds bytes that are not text, not a step name; {fix}"
        ) from None


def _link_step_name(link: str) -> str:
    """The step a local `last` link names. A hand-made link holding a path (`/abs/checkpoints/005000`,
    `./005000`) counts when it lands directly inside the link's own directory; otherwise the target
    text is returned as is, for the caller to refuse."""
    target = os.readlink(link).rstrip("/")
    parent = os.path.dirname(link)
    landed = os.path.normpath(os.path.join(parent, target))
    if os.path.realpath(os.path.dirname(landed)) == os.path.realpath(parent):
        return os.path.basename(landed)
    return target


def tmp_step_dir(checkpoints_dir: str | os.PathLike[str], step: int) -> str:
    """Where step `step` is written before it is complete: `checkpoints/.tmp-005000`.

    The name is deterministic so every rank of a collective save computes the same one; readers never
    take a `.tmp-` directory for a step because it does not match `layout.is_step_dir_name`.
    """
    return layout.join(os.fspath(checkpoints_dir), layout.TMP_PREFIX + layout.step_dir_name(step))


def begin_step_dir(checkpoints_dir: str | os.PathLike[str], step: int) -> str:
    """Create an empty temporary step directory (removing the leftovers of a crashed save of the same
    step) and return its path. Call on the main rank only, before the other ranks write into it."""
    tmp = tmp_step_dir(checkpoints_dir, step)
    remove_tree(tmp)
    makedirs(tmp)
    return tmp


def commit_step_dir(
    tmp_dir: str,
    checkpoints_dir: str | os.PathLike[str],
    step: int,
    *,
    is_complete: Callable[[str], bool],
) -> str:
    """Rename a complete temporary step directory to its final name, then move `last` to it.

    The order is what makes a crash harmless: until the rename the step does not exist for readers,
    and `last` moves only after the rename. Replacing an existing directory of the same step (a save
    repeated after resuming from an earlier step) takes five steps, each leaving `last` on a complete
    step (or absent) if the process dies right after it:
    1. when `last` names that step, it moves to the newest other step that `is_complete` accepts (is
       removed if none); `is_complete(step_dir)` is the caller's check (a save passes verify's);
    2. the old directory is renamed aside to `.tmp-old-<step>`;
    3. the new one is renamed in; 4. `last` moves to it; 5. the old one is deleted.
    Returns the final path.
    """
    root = os.fspath(checkpoints_dir).rstrip("/")
    name = layout.step_dir_name(step)
    final = layout.join(root, name)
    old = layout.join(root, f"{layout.TMP_PREFIX}old-{name}")
    fs, final_inner = resolve(final)
    if fs.exists(final_inner):
        if _last_may_name(root, name):
            _step_back_last(root, name, is_complete)
        remove_tree(old)
        _rename_dir(fs, final_inner, resolve(old)[1])
    _rename_dir(fs, resolve(tmp_dir)[1], final_inner)
    point_last(root, name)
    remove_tree(old)  # also the leftover of a replacement that crashed before this point
    return final


def _last_may_name(root: str, name: str) -> bool:
    """Whether `last` could lead to step `name` while it is swapped (a broken `last` might)."""
    if not has_last(root):
        return False
    try:
        return layout.name(read_last(root)) == name
    except CheckpointError:
        return True


def _step_back_last(root: str, name: str, is_complete: Callable[[str], bool]) -> None:
    """Point `last` at the newest step other than `name` that `is_complete` accepts, or remove it when
    none does. A check that raises a `CheckpointError` counts as incomplete."""
    steps = sorted(
        (entry for entry in list_names(root) if layout.is_step_dir_name(entry) and entry != name),
        key=int,
        reverse=True,
    )
    for candidate in steps:
        try:
            complete = is_complete(layout.join(root, candidate))
        except CheckpointError:
            complete = False
        if complete:
            point_last(root, candidate)
            return
    remove_last(root)


def remove_last(checkpoints_dir: str | os.PathLike[str], pointer: str = layout.LAST) -> None:
    """Delete the `last` pointer (or `pointer`: one unlink or object delete); a missing one is not an
    error."""
    root = os.fspath(checkpoints_dir).rstrip("/")
    fs, inner = resolve(layout.join(root, pointer))
    if is_local(fs):
        if os.path.lexists(inner):
            os.remove(inner)
    elif fs.isfile(inner):
        fs.rm(inner)


def _rename_dir(fs: fsspec.AbstractFileSystem, src: str, dst: str) -> None:
    """Rename in one step on local disk; on an object store, copy then delete (`storage.move_tree`)
    with `training_step.json` copied last and deleted first, so at every moment of a crash a directory
    holding it is complete: a half-copied step, or a half-deleted source, lacks it and is never taken
    for a checkpoint (`verify` and every loader need it)."""
    if is_local(fs):
        os.rename(src, dst)  # atomic on one filesystem
    else:
        move_tree(fs, src, dst, last=f"/{layout.TRAINING_STATE_DIR}/{layout.TRAINING_STEP}")


def point_last(checkpoints_dir: str | os.PathLike[str], step_name: str) -> None:
    """Make `checkpoints/last` name `step_name` (`point`)."""
    point(checkpoints_dir, layout.LAST, step_name)


def point(checkpoints_dir: str | os.PathLike[str], pointer: str, step_name: str) -> None:
    """Make `checkpoints/<pointer>` (`last`, `best`) name `step_name`, replacing the old pointer in one
    step.

    On local disk a pointer is a relative symlink (`last -> 005000`) created under a temporary name and
    moved over the old one with `os.replace`, so a reader sees either the old or the new target. Stores
    without links get a text file holding the step name (one object write, atomic on object stores).
    """
    if not layout.is_step_dir_name(step_name):
        raise ValueError(f"{step_name!r} is not a step directory name")
    root = os.fspath(checkpoints_dir).rstrip("/")
    fs, inner_root = resolve(root)
    if not is_local(fs):
        write_text(layout.join(root, pointer), step_name + "\n")
        return
    last = os.path.join(inner_root, pointer)
    if os.path.isdir(last) and not os.path.islink(last):  # os.replace cannot put a link over it
        raise CorruptCheckpointError(
            f"{last} is a directory, not a pointer: move it away (it may hold a copied step), then "
            f"resume; the step was written but `last` still does not name it"
        )
    tmp = os.path.join(inner_root, f"{layout.TMP_PREFIX}{pointer}-{os.getpid()}")
    if os.path.lexists(tmp):
        os.remove(tmp)
    try:
        os.symlink(step_name, tmp)
    except OSError:  # a local filesystem without symlinks: fall back to the text form
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(step_name + "\n")
    os.replace(tmp, last)


def latest_step_dir(path: str | os.PathLike[str]) -> str | None:
    """The step directory `last` names, given a run's output_dir or its `checkpoints/` directory.

    Returns None when no checkpoint has been committed yet (no `last`), so a trainer can ask before
    the first save without catching errors.
    """
    root = os.fspath(path).rstrip("/")
    if exists(layout.join(root, layout.CHECKPOINTS_DIR)):
        root = layout.join(root, layout.CHECKPOINTS_DIR)
    return read_last(root) if has_last(root) else None


def prune_steps(
    checkpoints_dir: str | os.PathLike[str], keep_last: int, keep: Collection[str] = ()
) -> list[str]:
    """Retention after a commit: delete all but the `keep_last` newest step directories up to the one
    `last` names (0 keeps all), and never the steps named in `keep` (one a background push still reads:
    a later retention deletes it). Returns the names deleted, oldest first.

    It counts what is on disk, so it works across restarts. It never deletes the step `last` names
    (the newest one kept), the one `best` names, a step newer than `last` (left by a run that was
    resumed from an earlier step: the resumed run replaces it when it gets there), or a `.tmp-`
    directory (a save being written). The step a run resumed from is older than `last` only once a
    newer step is committed. The K best-scored steps of `--keep_best` reach it in `keep`
    (files/scores.py: `best_steps`).
    """
    root = os.fspath(checkpoints_dir).rstrip("/")
    if keep_last < 1 or not has_last(root):
        return []
    newest = int(layout.name(read_last(root)))
    steps = sorted(int(name) for name in list_names(root) if layout.is_step_dir_name(name))
    older = [step for step in steps if step <= newest][:-keep_last]
    spared = {*keep, *_best_name(root)}
    older = [step for step in older if layout.step_dir_name(step) not in spared]
    for step in older:
        remove_tree(layout.join(root, layout.step_dir_name(step)))
    return [layout.step_dir_name(step) for step in older]


def _best_name(root: str) -> list[str]:
    """The step `best` names, if it names one (a broken `best` spares nothing: retention never reads a
    pointer it cannot follow as a reason to delete)."""
    if not has_pointer(root, layout.BEST):
        return []
    try:
        return [layout.name(read_pointer(root, layout.BEST))]
    except CheckpointError:
        return []
