"""The atomic step commit and the `last` pointer, on local disk and on a store without links."""

from __future__ import annotations

import os

import pytest

from ckpt_tools import storage
from ckpt_tools.errors import CorruptCheckpointError


def write_step(root, step: int, marker: str) -> str:
    tmp = storage.begin_step_dir(root, step)
    storage.write_text(f"{tmp}/pretrained_model/marker.txt", marker)
    return tmp


def test_step_is_invisible_until_committed(tmp_path):
    tmp = write_step(tmp_path, 5000, "a")
    assert os.path.basename(tmp) == ".tmp-005000"
    assert storage.latest_step_dir(tmp_path) is None
    assert not (tmp_path / "005000").exists()

    final = storage.commit_step_dir(tmp, tmp_path, 5000)

    assert final == f"{tmp_path}/005000"
    assert os.readlink(tmp_path / "last") == "005000"  # relative, so the run directory can move
    assert storage.latest_step_dir(tmp_path) == final
    assert sorted(os.listdir(tmp_path)) == ["005000", "last"]


def test_last_moves_only_forward_to_committed_steps(tmp_path):
    storage.commit_step_dir(write_step(tmp_path, 1, "a"), tmp_path, 1)
    write_step(tmp_path, 2, "b")  # a save that never completes
    assert storage.read_last(tmp_path) == f"{tmp_path}/000001"
    storage.commit_step_dir(write_step(tmp_path, 2, "c"), tmp_path, 2)
    assert storage.read_last(tmp_path) == f"{tmp_path}/000002"
    assert (tmp_path / "last" / "pretrained_model" / "marker.txt").read_text() == "c"


def test_begin_clears_a_crashed_save_of_the_same_step(tmp_path):
    tmp = write_step(tmp_path, 3, "partial")
    storage.write_text(f"{tmp}/pretrained_model/stale.bin", "x")
    tmp = storage.begin_step_dir(tmp_path, 3)
    assert os.listdir(tmp) == []


def test_committing_an_existing_step_replaces_it(tmp_path):
    storage.commit_step_dir(write_step(tmp_path, 4, "old"), tmp_path, 4)
    storage.commit_step_dir(write_step(tmp_path, 4, "new"), tmp_path, 4)
    assert sorted(os.listdir(tmp_path)) == ["000004", "last"]
    assert (tmp_path / "000004" / "pretrained_model" / "marker.txt").read_text() == "new"


def test_output_dir_and_file_url_find_the_last_step(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    storage.commit_step_dir(write_step(checkpoints, 10, "a"), checkpoints, 10)
    assert storage.latest_step_dir(tmp_path) == f"{checkpoints}/000010"
    assert storage.read_last(f"file://{checkpoints}") == f"file://{checkpoints}/000010"
    assert storage.resolve_model_dir(checkpoints / "last")[0] == f"{checkpoints}/000010"


def test_memory_store_uses_a_text_pointer():
    root = "memory://storage-commit/checkpoints"
    assert storage.latest_step_dir(root) is None
    storage.commit_step_dir(write_step(root, 8, "a"), root, 8)
    assert storage.read_text(f"{root}/last") == "000008\n"
    assert storage.latest_step_dir("memory://storage-commit") == f"{root}/000008"
    assert storage.read_text(f"{root}/000008/pretrained_model/marker.txt") == "a"
    assert not storage.exists(f"{root}/.tmp-000008")
    storage.remove_tree("memory://storage-commit")


def test_a_last_naming_something_else_is_corrupt(tmp_path):
    (tmp_path / "last").write_text("../../etc\n")
    with pytest.raises(CorruptCheckpointError, match="not a step directory"):
        storage.read_last(tmp_path)


def test_point_last_refuses_a_non_step_name(tmp_path):
    with pytest.raises(ValueError, match="not a step directory name"):
        storage.point_last(tmp_path, ".tmp-000001")
