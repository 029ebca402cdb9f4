"""`last` is never absent, nor dangling, at any moment of a commit that moves it.

A reader racing the commit would see the gap between two filesystem calls only by luck; an audit hook
sees every one of them. Before each call that changes the directory (and once after the commit) the
hook checks what a reader would find at that instant: `last` exists and names a complete step.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from report_fixtures import tiny_model_state, write_step_dir
from safetensors.torch import load_file

from ckpt_tools.files import commit
from ckpt_tools.reports.verify import verify_checkpoint

_COMPLETE = ("pretrained_model/model.safetensors", "training_state/training_step.json")
_MUTATING_EVENTS = {"os.remove", "os.rename", "os.symlink", "os.rmdir", "os.link", "shutil.rmtree"}
_watched: list[Path] = []  # the checkpoints directory under watch (the hook cannot be removed)
_seen: list[str] = []  # what a reader would have found wrong, one line per moment
_events: list[str] = []  # every watched call, so the test knows the hook saw the commit
_named: list[list[str]] = []  # where the test wants the step `last` names at each moment


def _reader_view(root: Path) -> str | None:
    """What is wrong with `last` right now, or None. Only calls that raise no audit event."""
    last = root / "last"
    if not os.path.lexists(last):
        return "last is absent"
    target = root / os.readlink(last) if last.is_symlink() else None
    complete = target is not None and all((target / part).is_file() for part in _COMPLETE)
    return None if complete else f"last names an incomplete step ({target})"


def _hook(event: str, args: tuple) -> None:
    if _watched and event in _MUTATING_EVENTS:
        _events.append(event)
        if _named and os.path.islink(_watched[0] / "last"):
            _named[0].append(os.readlink(_watched[0] / "last"))
        problem = _reader_view(_watched[0])
        if problem:
            _seen.append(f"before {event}{args}: {problem}")


sys.addaudithook(_hook)


@contextmanager
def _watch(root: Path, named: list[str] | None = None) -> Iterator[list[str]]:
    _seen.clear()
    _events.clear()
    _watched.append(root)
    if named is not None:
        _named.append(named)
    try:
        yield _seen
    finally:
        _watched.clear()
        _named.clear()
    problem = _reader_view(root)
    if problem:
        _seen.append(f"after the commit: {problem}")


def _commit(root: Path, step: int, seed: int) -> None:
    """Write a complete step (weights from `seed`) as `.tmp-<step>`, then commit it."""
    tmp = Path(commit.begin_step_dir(root, step))
    tmp.rmdir()
    staged = write_step_dir(root / "scratch", step=step, state=tiny_model_state(seed))
    staged.rename(tmp)
    (root / "scratch").rmdir()
    commit.commit_step_dir(str(tmp), root, step, is_complete=lambda path: verify_checkpoint(path).ok)


def test_last_is_present_and_complete_at_every_moment_of_a_commit(tmp_path: Path) -> None:
    _commit(tmp_path, 2, seed=2)
    _commit(tmp_path, 4, seed=4)
    with _watch(tmp_path) as seen:
        _commit(tmp_path, 6, seed=6)  # last moves to a new step
        _commit(tmp_path, 6, seed=60)  # the step last names is replaced (last steps back to 4 meanwhile)
        _commit(tmp_path, 4, seed=40)  # a step last does not name is replaced
    assert seen == []
    assert {"os.symlink", "os.rename"} <= set(_events)  # the hook did watch the commits
    assert os.readlink(tmp_path / "last") == "000004"
    weights = load_file(tmp_path / "000006" / "pretrained_model" / "model.safetensors")
    assert torch.equal(weights["encoder.weight"], tiny_model_state(60)["encoder.weight"])


def test_replacing_a_step_last_does_not_name_moves_last_only_to_it(tmp_path: Path) -> None:
    """Resumed from step 4 with steps 6 and 8 left by the first attempt: saving step 6 again must not
    point `last` at step 8, not even for a moment (a crash then would resume from the abandoned 8)."""
    for step in (2, 4, 6, 8):
        _commit(tmp_path, step, seed=step)
    _commit(tmp_path, 4, seed=40)  # the resumed run's first save
    named: list[str] = []
    with _watch(tmp_path, named) as seen:
        _commit(tmp_path, 6, seed=60)
    assert seen == []
    assert named[0] == "000004" and set(named) == {"000004", "000006"}
    assert os.readlink(tmp_path / "last") == "000006"
