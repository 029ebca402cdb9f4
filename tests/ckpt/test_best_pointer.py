"""A step's scores (eval.json), the ranking of the steps by one figure, the `best` pointer beside `last`:
written atomically, followed by every reader, and spared by `--keep_last` pruning with the K best."""

from __future__ import annotations

import json
import os

import pytest
from test_retention import committed, names

import ckpt_tools
from ckpt_tools.files import commit, locate


def _scored(root, step: int, **overall: float) -> None:
    ckpt_tools.training.write_scores(f"{root}/{step:06d}", {"step": step, "env": "pusht", "overall": overall})


def test_scores_are_merged_into_one_file_written_whole(tmp_path) -> None:
    committed(tmp_path, 2)
    step = f"{tmp_path}/000002"
    assert ckpt_tools.read_scores(step) is None
    ckpt_tools.training.write_scores(step, {"step": 2, "overall": {"val_loss": 0.5}})
    merged = ckpt_tools.training.write_scores(step, {"env": "pusht", "overall": {"pc_success": 40.0}})
    assert merged == {"step": 2, "env": "pusht", "overall": {"val_loss": 0.5, "pc_success": 40.0}}
    assert json.loads((tmp_path / "000002" / "eval.json").read_text()) == merged
    assert [n for n in os.listdir(tmp_path / "000002") if n.startswith("eval.json")] == ["eval.json"]


def test_steps_are_ranked_by_their_figure_either_way(tmp_path) -> None:
    committed(tmp_path, 2, 4, 6, 8, 10)
    _scored(tmp_path, 2, avg_sum_reward=3.0, val_loss=0.9)
    _scored(tmp_path, 4, avg_sum_reward=7.0, val_loss=0.2)
    _scored(tmp_path, 6, avg_sum_reward=float("nan"), val_loss=0.4)  # a NaN ranks nowhere
    ckpt_tools.training.write_scores(f"{tmp_path}/000008", {"step": 8, "env": "pusht", "error": "hung"})
    _scored(tmp_path, 10, avg_sum_reward=7.0, val_loss=0.6)  # a tie goes to the newer step
    assert ckpt_tools.best_steps(str(tmp_path), ckpt_tools.Ranking("avg_sum_reward", "max", 2)) == [
        "000010",
        "000004",
    ]
    mode = ckpt_tools.default_mode("val_loss")
    assert mode == "min" and ckpt_tools.default_mode("pc_success") == "max"
    assert ckpt_tools.best_steps(str(tmp_path), ckpt_tools.Ranking("val_loss", mode, 3)) == [
        "000004",
        "000006",
        "000010",
    ]
    with pytest.raises(ckpt_tools.UsageError, match="max or min"):
        ckpt_tools.Ranking("val_loss", "lowest")


def test_best_is_a_pointer_every_reader_follows(tmp_path) -> None:
    root = tmp_path / "run" / "checkpoints"
    root.mkdir(parents=True)
    committed(root, 2, 4)
    ranking = ckpt_tools.Ranking("pc_success", "max", 1)
    assert ckpt_tools.training.point_best(str(root), ranking) is None and not (root / "best").exists()
    _scored(root, 2, pc_success=60.0)
    _scored(root, 4, pc_success=20.0)
    assert ckpt_tools.training.point_best(str(root), ranking) == "000002"
    assert os.readlink(root / "best") == "000002" and os.readlink(root / "last") == "000004"
    assert commit.follow_pointers(root / "best") == f"{root}/000002"
    assert locate.resolve_model_dir(root / "best" / "pretrained_model")[0] == f"{root}/000002"
    assert locate.resolve_model_dir(tmp_path / "run")[0] == f"{root}/000004"  # a run still means `last`


def test_best_refuses_what_last_refuses(tmp_path) -> None:
    committed(tmp_path, 2)
    (tmp_path / "best").symlink_to("/etc")
    with pytest.raises(ckpt_tools.CorruptCheckpointError, match="best points to"):
        commit.follow_pointers(tmp_path / "best")


def test_pruning_spares_the_k_best_and_the_step_best_names(tmp_path) -> None:
    committed(tmp_path, 2, 4, 6, 8)
    _scored(tmp_path, 2, avg_sum_reward=9.0)
    _scored(tmp_path, 4, avg_sum_reward=1.0)
    _scored(tmp_path, 6, avg_sum_reward=5.0)
    ranking = ckpt_tools.Ranking("avg_sum_reward", "max", 2)
    ckpt_tools.training.point_best(str(tmp_path), ranking)
    keep = ckpt_tools.best_steps(str(tmp_path), ranking)
    assert ckpt_tools.training.prune_steps(str(tmp_path), 1, keep) == ["000004"]
    assert names(tmp_path) == ["000002", "000006", "000008", "best", "last"]
    assert ckpt_tools.training.prune_steps(str(tmp_path), 1) == ["000006"]  # `best` alone still spares 2
    assert names(tmp_path) == ["000002", "000008", "best", "last"]
