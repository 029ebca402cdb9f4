"""Names of the format and resolution of the paths users pass."""

from __future__ import annotations

import os

import pytest

from ckpt_tools import layout
from ckpt_tools.errors import CheckpointNotFoundError, CorruptCheckpointError
from ckpt_tools.files import locate


def test_step_names_sort_numerically():
    names = [layout.step_dir_name(s) for s in (5000, 20, 100000)]
    assert names == ["005000", "000020", "100000"]
    assert sorted(names) == ["000020", "005000", "100000"]
    assert all(layout.is_step_dir_name(n) for n in names)
    assert not layout.is_step_dir_name(".tmp-000020")


def test_negative_step_is_refused():
    with pytest.raises(ValueError):
        layout.step_dir_name(-1)


def test_sharded_names_follow_transformers():
    assert layout.sharded_model_name(1, 3) == "model-00001-of-00003.safetensors"


def make_run(root):
    step = root / "checkpoints" / "000010"
    (step / "pretrained_model").mkdir(parents=True)
    (step / "training_state").mkdir()
    os.symlink("000010", root / "checkpoints" / "last")
    return step


def test_resolve_accepts_every_entry_point(tmp_path):
    step = make_run(tmp_path)
    expected = (str(step), str(step / "pretrained_model"))
    assert locate.resolve_model_dir(step) == expected
    assert locate.resolve_model_dir(step / "pretrained_model") == expected
    assert locate.resolve_model_dir(tmp_path) == expected
    assert locate.resolve_model_dir(tmp_path / "checkpoints" / "last") == expected


def test_resolve_bare_model_dir(tmp_path):
    assert locate.resolve_model_dir(tmp_path) == (None, str(tmp_path))


def test_resolve_missing_path(tmp_path):
    with pytest.raises(CheckpointNotFoundError, match="no such file"):
        locate.resolve_model_dir(tmp_path / "nope")


def test_last_as_text_file_on_stores_without_links(tmp_path):
    step = tmp_path / "checkpoints" / "000010"
    (step / "pretrained_model").mkdir(parents=True)
    (tmp_path / "checkpoints" / "last").write_text("000010\n")
    assert locate.resolve_model_dir(tmp_path)[0] == str(step)


def test_last_naming_garbage_is_corrupt(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last").write_text("../../etc\n")
    with pytest.raises(CorruptCheckpointError, match="not a step directory"):
        locate.resolve_model_dir(tmp_path)


def test_path_helpers_work_for_local_paths_and_urls() -> None:
    assert layout.parent("/runs/a/checkpoints/000004") == "/runs/a/checkpoints"
    assert layout.parent("s3://bucket/run/checkpoints/last/") == "s3://bucket/run/checkpoints"
    assert layout.parent("/x") == "/" and layout.parent("model.safetensors") == "."
    assert layout.name("s3://bucket/run/000004/") == "000004" and layout.name("a") == "a"
    assert layout.is_url("s3://bucket/x") and not layout.is_url("/data/x")
