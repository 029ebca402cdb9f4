"""The atomic step commit and the `last` pointer, on local disk and on a store without links."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from report_fixtures import run_ckpt, tiny_model_state, write_step_dir
from safetensors.torch import load

from ckpt_tools.errors import CorruptCheckpointError
from ckpt_tools.files import commit, locate, storage
from ckpt_tools.reports.verify import verify_checkpoint


def commit_step(tmp: str, root: str | os.PathLike[str], step: int) -> str:
    """Commit as a save does: a step `last` falls back to must verify."""
    return commit.commit_step_dir(
        tmp, root, step, is_complete=lambda step_dir: verify_checkpoint(step_dir).ok
    )


def write_step(root, step: int, marker: str) -> str:
    tmp = commit.begin_step_dir(root, step)
    storage.write_text(f"{tmp}/pretrained_model/marker.txt", marker)
    return tmp


def test_step_is_invisible_until_committed(tmp_path):
    tmp = write_step(tmp_path, 5000, "a")
    assert os.path.basename(tmp) == ".tmp-005000"
    assert commit.latest_step_dir(tmp_path) is None
    assert not (tmp_path / "005000").exists()

    final = commit_step(tmp, tmp_path, 5000)

    assert final == f"{tmp_path}/005000"
    assert os.readlink(tmp_path / "last") == "005000"  # relative, so the run directory can move
    assert commit.latest_step_dir(tmp_path) == final
    assert sorted(os.listdir(tmp_path)) == ["005000", "last"]


def test_last_moves_only_forward_to_committed_steps(tmp_path):
    commit_step(write_step(tmp_path, 1, "a"), tmp_path, 1)
    write_step(tmp_path, 2, "b")  # a save that never completes
    assert commit.read_last(tmp_path) == f"{tmp_path}/000001"
    commit_step(write_step(tmp_path, 2, "c"), tmp_path, 2)
    assert commit.read_last(tmp_path) == f"{tmp_path}/000002"
    assert (tmp_path / "last" / "pretrained_model" / "marker.txt").read_text() == "c"


def test_begin_clears_a_crashed_save_of_the_same_step(tmp_path):
    tmp = write_step(tmp_path, 3, "partial")
    storage.write_text(f"{tmp}/pretrained_model/stale.bin", "x")
    tmp = commit.begin_step_dir(tmp_path, 3)
    assert os.listdir(tmp) == []


def test_committing_an_existing_step_replaces_it(tmp_path):
    commit_step(write_step(tmp_path, 4, "old"), tmp_path, 4)
    commit_step(write_step(tmp_path, 4, "new"), tmp_path, 4)
    assert sorted(os.listdir(tmp_path)) == ["000004", "last"]
    assert (tmp_path / "000004" / "pretrained_model" / "marker.txt").read_text() == "new"


def test_output_dir_and_file_url_find_the_last_step(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    commit_step(write_step(checkpoints, 10, "a"), checkpoints, 10)
    assert commit.latest_step_dir(tmp_path) == f"{checkpoints}/000010"
    assert commit.read_last(f"file://{checkpoints}") == f"file://{checkpoints}/000010"
    assert locate.resolve_model_dir(checkpoints / "last")[0] == f"{checkpoints}/000010"


def test_a_file_url_is_local_disk_for_every_check(tmp_path):
    """Plain paths are answered with os, file:// URLs through fsspec: both get the local checks (a
    link leading out is refused, `last` as a link) and the same answers."""
    step = write_step_dir(tmp_path / "run", "safetensors")
    (tmp_path / "secret").write_text("{}")
    (step / "pretrained_model" / "config.json").unlink()
    os.symlink(tmp_path / "secret", step / "pretrained_model" / "config.json")
    for path in (str(step), f"file://{step}"):
        with pytest.raises(CorruptCheckpointError, match="link leading outside"):
            storage.check_links(path)
        with pytest.raises(CorruptCheckpointError, match="link leading outside"):
            storage.contained(path, "pretrained_model/config.json", "a test")
        model = f"{path}/pretrained_model"
        assert storage.local_path(model) == str(step / "pretrained_model")
        assert storage.is_dir(model) and not storage.is_file(model) and storage.exists(model)
        assert storage.is_link(f"{model}/config.json") and storage.size(f"{model}/config.json") == 2
        files = storage.list_files(model)
        assert files["config.json"] is None  # a link is no regular file, as fsspec's listing types it
        assert files["model.safetensors"] == (step / "pretrained_model" / "model.safetensors").stat().st_size
        assert storage.list_names(model) == sorted(os.listdir(step / "pretrained_model"))
    assert storage.local_path("memory://x/y") is None


def test_memory_store_uses_a_text_pointer():
    root = "memory://storage-commit/checkpoints"
    assert commit.latest_step_dir(root) is None
    commit_step(write_step(root, 8, "a"), root, 8)
    assert storage.read_text(f"{root}/last") == "000008\n"
    assert commit.latest_step_dir("memory://storage-commit") == f"{root}/000008"
    assert storage.read_text(f"{root}/000008/pretrained_model/marker.txt") == "a"
    assert not storage.exists(f"{root}/.tmp-000008")
    storage.remove_tree("memory://storage-commit")


def test_a_last_naming_something_else_is_corrupt(tmp_path):
    (tmp_path / "last").write_text("../../etc\n")
    with pytest.raises(CorruptCheckpointError, match="not a step directory"):
        commit.read_last(tmp_path)


def test_point_last_refuses_a_non_step_name(tmp_path):
    with pytest.raises(ValueError, match="not a step directory name"):
        commit.point_last(tmp_path, ".tmp-000001")


# --- replacing a step: `last` names a complete step at every moment --------------------------------

_MUTATIONS = ("_rename_dir", "point_last", "remove_last", "remove_tree")


class _Crash(Exception):
    """The process dies here: nothing after this point of the commit runs."""


def _crash_at(monkeypatch: pytest.MonkeyPatch, when: int) -> None:
    """Make the `when`-th directory or pointer mutation of the commit raise before it happens."""
    count = [0]
    for name in _MUTATIONS:

        def mutation(*args, _real=getattr(commit, name), **kwargs):  # type: ignore[no-untyped-def]
            count[0] += 1
            if count[0] == when:
                raise _Crash
            return _real(*args, **kwargs)

        monkeypatch.setattr(commit, name, mutation)


def _stage(root: str | Path, step: int, seed: int) -> str:
    """A complete step written as `.tmp-<step>` under `root` (local or `memory://`), ready to commit."""
    scratch = Path(tempfile.mkdtemp())
    staged = write_step_dir(scratch, step=step, state=tiny_model_state(seed))
    tmp = commit.begin_step_dir(root, step)
    fs, inner = storage.resolve(tmp)
    fs.rm(inner, recursive=True)
    fs.put(str(staged), inner, recursive=True)
    shutil.rmtree(scratch)
    return tmp


def _last_state(root: str | Path) -> dict[str, torch.Tensor] | None:
    """The weights of the step `last` names, after checking that step verifies; None without `last`."""
    if not commit.has_last(root):
        return None
    step_dir = commit.read_last(root)
    report = verify_checkpoint(step_dir)
    assert report.ok, report.problems
    return load(storage.read_bytes(f"{step_dir}/pretrained_model/model.safetensors"))


def _seed_of(state: dict[str, torch.Tensor] | None) -> int | None:
    """Which staged step these weights came from (None: there is no `last`)."""
    if state is None:
        return None
    weight = state["encoder.weight"]
    return next(seed for seed in (3, 6, 60) if torch.equal(weight, tiny_model_state(seed)["encoder.weight"]))


@pytest.mark.parametrize("store", ["local", "memory"])
@pytest.mark.parametrize("earlier_step", [True, False])
def test_a_crash_while_replacing_the_last_step_leaves_last_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, earlier_step: bool, store: str
) -> None:
    """Resumed from step 3 while `last -> 000006`: the new step 6 replaces the old one. The commit
    is cut before each of its mutations in turn; `last` must always lead to a step that verifies."""
    seen = set()
    for when in range(1, 20):
        base = f"memory://{tmp_path.name}-{when}" if store == "memory" else str(tmp_path / f"crash-{when}")
        root = f"{base}/checkpoints"
        if earlier_step:
            commit_step(_stage(root, 3, seed=3), root, 3)
        commit_step(_stage(root, 6, seed=6), root, 6)
        tmp = _stage(root, 6, seed=60)
        _crash_at(monkeypatch, when)
        try:
            commit_step(tmp, root, 6)
            finished = True
        except _Crash:
            finished = False
        monkeypatch.undo()
        seen.add(_seed_of(_last_state(root)))
        # the run restarts and saves step 6 again: that save completes and cleans up after the crash
        commit_step(_stage(root, 6, seed=60), root, 6)
        assert _seed_of(_last_state(root)) == 60
        assert storage.list_names(root) == (["000003"] if earlier_step else []) + ["000006", "last"]
        storage.remove_tree(base)
        if finished:
            break
    assert finished and when >= 5
    # a crash mid-replacement fell back to step 3 (or to no `last`), never to a missing directory
    assert seen == ({3, 6, 60} if earlier_step else {None, 6, 60})


def test_replacing_a_step_that_last_does_not_name_keeps_last_until_the_end(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    commit_step(_stage(root, 3, seed=3), root, 3)
    commit_step(_stage(root, 6, seed=6), root, 6)
    commit_step(_stage(root, 3, seed=60), root, 3)  # resumed from 2, say
    assert os.readlink(root / "last") == "000003"
    assert torch.equal(_last_state(root)["encoder.weight"], tiny_model_state(60)["encoder.weight"])


@pytest.mark.parametrize(("damaged", "newest_complete"), [(False, "000004"), (True, "000003")])
def test_step_back_goes_to_the_newest_complete_step(
    tmp_path: Path, damaged: bool, newest_complete: str
) -> None:
    root = tmp_path / "checkpoints"
    for step in (3, 4, 6):
        commit_step(_stage(root, step, seed=step), root, step)
    if damaged:
        (root / "000004" / "training_state" / "rng_state.safetensors").unlink()  # damaged by hand
    tmp = _stage(root, 6, seed=60)
    with pytest.MonkeyPatch.context() as patch:
        _crash_at(patch, 3)  # after `last` stepped back and the old step 6 was set aside
        with pytest.raises(_Crash):
            commit_step(tmp, root, 6)
    assert os.readlink(root / "last") == newest_complete


def test_step_back_treats_a_check_that_raises_as_incomplete(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    for step in (3, 4, 6):
        commit_step(_stage(root, step, seed=step), root, step)

    def is_complete(step_dir: str) -> bool:
        if step_dir.endswith("000004"):
            raise CorruptCheckpointError("unreadable")
        return True

    tmp = _stage(root, 6, seed=60)
    with pytest.MonkeyPatch.context() as patch:
        _crash_at(patch, 3)  # after `last` stepped back and the old step 6 was set aside
        with pytest.raises(_Crash):
            commit.commit_step_dir(tmp, root, 6, is_complete=is_complete)
    assert os.readlink(root / "last") == "000003"


# --- readers follow `last` only to a complete step beside it ---------------------------------------


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """An output_dir with one complete step, and a complete step of another run next to it."""
    root = tmp_path / "run" / "checkpoints"
    commit_step(_stage(root, 5, seed=3), root, 5)
    other = tmp_path / "other"
    write_step_dir(other, step=5, state=tiny_model_state(6))
    (root / ".tmp-000007").mkdir()
    return tmp_path / "run"


@pytest.mark.parametrize(
    ("target", "fragment"),
    [
        ("/etc", "'/etc', which is not a step directory inside"),
        ("../../other/000005", "'../../other/000005', which is not a step directory inside"),
        (".tmp-000007", "'.tmp-000007', which is not a step directory inside"),
        ("000009", "names 000009, which does not exist"),
    ],
)
def test_readers_refuse_a_last_leading_elsewhere(run_dir: Path, target: str, fragment: str) -> None:
    last = run_dir / "checkpoints" / "last"
    last.unlink()
    last.symlink_to(target)
    for path in (run_dir, run_dir / "checkpoints", last, last / "pretrained_model"):
        with pytest.raises(CorruptCheckpointError, match=fragment):
            locate.resolve_model_dir(path)
    with pytest.raises(CorruptCheckpointError, match=fragment):
        commit.latest_step_dir(run_dir)
    result = run_ckpt("verify", last / "pretrained_model")
    assert result.exit_code == 1 and fragment in " ".join(result.output.split())


def test_a_hand_made_absolute_link_inside_the_directory_is_followed(run_dir: Path) -> None:
    checkpoints = run_dir / "checkpoints"
    (checkpoints / "last").unlink()
    (checkpoints / "last").symlink_to(checkpoints / "000005")
    assert commit.latest_step_dir(run_dir) == f"{checkpoints}/000005"
    assert locate.resolve_model_dir(checkpoints / "last" / "pretrained_model") == (
        f"{checkpoints}/000005",
        f"{checkpoints}/000005/pretrained_model",
    )


def test_a_text_pointer_to_a_tmp_directory_is_refused() -> None:
    root = "memory://storage-commit-tmp/checkpoints"
    storage.makedirs(f"{root}/.tmp-000004")
    storage.write_text(f"{root}/last", ".tmp-000004\n")
    with pytest.raises(CorruptCheckpointError, match="not a step directory"):
        commit.latest_step_dir(root)
    storage.remove_tree("memory://storage-commit-tmp")


def test_a_directory_link_named_last_elsewhere_in_a_path_is_no_pointer(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    step_dir = write_step_dir(disk / "run" / "checkpoints", step=5)
    (tmp_path / "mnt").mkdir()
    (tmp_path / "mnt" / "last").symlink_to(disk)
    via_mount = tmp_path / "mnt" / "last" / "run" / "checkpoints" / step_dir.name
    assert locate.resolve_model_dir(via_mount) == (str(via_mount), f"{via_mount}/pretrained_model")


def test_a_path_ending_in_last_is_followed_whatever_its_directory_is_called(tmp_path):
    root = tmp_path / "saves"  # a checkpoints directory under another name
    commit_step(write_step(root, 5, "a"), root, 5)
    assert commit.follow_pointers(root / "last") == f"{root}/000005"
    for other in ("last/pretrained_model", "notes"):  # a `last` inside the path, another name: no pointer
        assert commit.follow_pointers(f"{root}/{other}") == f"{root}/{other}"


def test_without_symlinks_last_is_a_text_pointer_the_readers_follow(tmp_path, monkeypatch) -> None:
    root = tmp_path / "checkpoints"
    commit_step(_stage(root, 3, seed=3), root, 3)

    def no_symlinks(*args, **kwargs):
        raise OSError("symlinks not supported")

    monkeypatch.setattr(os, "symlink", no_symlinks)
    commit_step(_stage(root, 4, seed=4), root, 4)
    assert not (root / "last").is_symlink() and (root / "last").read_text() == "000004\n"
    assert commit.latest_step_dir(root) == str(root / "000004")
