"""`--keep_last` retention (`commit.prune_steps`): what is deleted after a commit, counted on disk."""

from __future__ import annotations

import os

from ckpt_tools.files import commit, storage


def committed(root, *steps: int) -> None:
    """Commit each step in turn (no completeness check is needed: `last` never steps back here)."""
    for step in steps:
        tmp = commit.begin_step_dir(root, step)
        storage.write_text(f"{tmp}/pretrained_model/marker.txt", str(step))
        commit.commit_step_dir(tmp, root, step, is_complete=lambda _: True)


def names(root) -> list[str]:
    return sorted(os.listdir(root))


def test_keeps_the_k_newest_and_last(tmp_path):
    committed(tmp_path, 2, 4, 6, 8)
    assert commit.prune_steps(tmp_path, 2) == ["000002", "000004"]
    assert names(tmp_path) == ["000006", "000008", "last"]
    assert os.readlink(tmp_path / "last") == "000008"


def test_zero_keeps_everything(tmp_path):
    committed(tmp_path, 2, 4, 6)
    assert commit.prune_steps(tmp_path, 0) == []
    assert names(tmp_path) == ["000002", "000004", "000006", "last"]


def test_k1_keeps_only_last_and_never_a_save_in_progress(tmp_path):
    committed(tmp_path, 2, 4)
    commit.begin_step_dir(tmp_path, 6)  # being written: not a step yet
    assert commit.prune_steps(tmp_path, 1) == ["000002"]
    assert names(tmp_path) == [".tmp-000006", "000004", "last"]


def test_counts_what_is_on_disk_across_restarts(tmp_path):
    """A restarted run prunes the steps an earlier process left, not only its own."""
    committed(tmp_path, 1, 2, 3)  # an earlier run kept everything (or was killed before pruning)
    committed(tmp_path, 4)
    assert commit.prune_steps(tmp_path, 2) == ["000001", "000002"]
    assert names(tmp_path) == ["000003", "000004", "last"]


def test_steps_newer_than_last_are_left_alone(tmp_path):
    """Resumed from step 3 of a run that had reached 6: its new step 4 is `last`; 5 and 6 are left for
    the resumed run to replace, and the resumed-from step 3 goes only now that 4 is committed."""
    committed(tmp_path, 3, 5, 6)
    commit.point_last(tmp_path, "000003")  # what a resume from step 3 continues from
    assert commit.prune_steps(tmp_path, 1) == []  # nothing newer committed yet: 3 stays
    committed(tmp_path, 4)
    assert commit.prune_steps(tmp_path, 1) == ["000003"]
    assert names(tmp_path) == ["000004", "000005", "000006", "last"]


def test_without_last_nothing_is_deleted(tmp_path):
    committed(tmp_path, 1)
    commit.remove_last(tmp_path)
    assert commit.prune_steps(tmp_path, 1) == []
    assert names(tmp_path) == ["000001"]
