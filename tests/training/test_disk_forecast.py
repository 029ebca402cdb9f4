"""The disk forecast at a run's first save (engine/checkpoint/disk_forecast.py): the arithmetic, and the line in
a real run's log and metrics when the disk cannot hold the checkpoints still to come."""

from __future__ import annotations

import shutil
from collections import namedtuple
from types import SimpleNamespace

import pytest

from ckpt_tools import Ranking
from helpers.fixtures import copy_fixture
from helpers.run_outputs import metrics
from trainer.cli import main
from trainer.engine.checkpoint import disk_forecast
from trainer.engine.checkpoint.disk_forecast import forecast, more_on_disk, saves_after


@pytest.mark.parametrize(
    "step, steps, save_freq, expected",
    [(2, 10, 2, 4), (250, 1000, 250, 3), (3, 10, 3, 3), (9, 10, 3, 1), (10, 10, 3, 0), (1, 1, 1, 0)],
)
def test_saves_after_counts_every_save_freq_and_the_last_step(step, steps, save_freq, expected) -> None:
    assert saves_after(step, steps, save_freq) == expected


@pytest.mark.parametrize(
    "step, steps, save_freq, eval_every, expected",
    [
        (2, 12, 4, 3, 6),
        (4, 12, 4, 6, 3),
        (4, 12, 4, 4, 2),
        (2, 11, 4, 3, 6),
        (9, 10, 4, 3, 1),
        (12, 12, 4, 3, 0),
    ],
)
def test_saves_after_counts_the_evaluators_saves_once(step, steps, save_freq, eval_every, expected) -> None:
    """--env_eval_freq adds its multiples (schedule.saves_at); a step both ask for is one save, and so
    is a last step that is one of them."""
    assert saves_after(step, steps, save_freq, eval_every) == expected
    schedule = [
        s for s in range(step + 1, steps + 1) if s % save_freq == 0 or s % eval_every == 0 or s == steps
    ]
    assert len(schedule) == expected


@pytest.mark.parametrize(
    "saves_left, on_disk, keep_last, expected",
    [(9, 1, 0, 9), (9, 1, 3, 3), (1, 1, 3, 1), (9, 4, 3, 0), (0, 1, 0, 0)],
)
def test_retention_caps_what_accumulates(saves_left, on_disk, keep_last, expected) -> None:
    """keep_last K: K steps kept plus the one being written before retention deletes the oldest."""
    assert more_on_disk(saves_left, on_disk, keep_last) == expected


def test_the_evaluators_saves_and_the_best_kept_are_forecast(tmp_path) -> None:
    """A run saving every 4 steps and every 3 for its evaluator, keeping 1 newest and the 2 best: after
    the first save (step 3 of 12) 5 more saves come, at most 1 + 2 + the one being written on disk."""
    step_dir = tmp_path / "checkpoints" / "000003"
    step_dir.mkdir(parents=True)
    (step_dir / "model.safetensors").write_bytes(b"0" * 1024)
    section = SimpleNamespace(
        steps=12, save_freq=4, eval_every=3, keep_last=1, ranking=Ranking("pc_success", keep=2)
    )
    line, record = disk_forecast.first_save_note(str(step_dir), section)  # type: ignore[arg-type]
    assert record["checkpoints_needed"] == 3 and "needs 3 more on disk" in line
    section.keep_last = 0
    assert disk_forecast.first_save_note(str(step_dir), section)[1]["checkpoints_needed"] == 5  # type: ignore[arg-type]


def test_room_is_the_whole_checkpoints_that_fit() -> None:
    assert forecast(step_bytes=10, free_bytes=95, needed=9).room == 9 and forecast(10, 95, 9).fits
    assert not forecast(step_bytes=10, free_bytes=89, needed=9).fits
    assert forecast(step_bytes=0, free_bytes=0, needed=3).fits  # an empty step directory never fills it


def test_a_bucket_is_skipped_with_a_note() -> None:
    line, record = disk_forecast.first_save_note("s3://bucket/run/checkpoints/000002", section=None)  # type: ignore[arg-type]
    assert line == "disk forecast skipped: checkpoints go to s3://bucket/run/checkpoints, a bucket URL"
    assert record == {}


def _run(root, output_dir, capsys, *extra: str) -> tuple[str, list[dict]]:
    args = ["train", f"--dataset.root={root}", "--policy.type=mlp", "--steps=8", "--save_freq=2", *extra]
    with pytest.raises(SystemExit) as exit_info:
        main([*args, f"--output_dir={output_dir}"])
    err = capsys.readouterr().err
    assert exit_info.value.code in (0, None), err
    records = metrics(output_dir)
    return err, [r for r in records if r.get("event") == "disk_forecast"]


def test_a_run_that_will_fill_its_disk_says_so_at_its_first_save(
    tmp_path, capsys, monkeypatch, clean_accelerate
) -> None:
    from accelerate.state import AcceleratorState

    root = copy_fixture(tmp_path, "lerobot", "dataset_tiny")
    err, records = _run(root, tmp_path / "roomy", capsys)
    assert "disk forecast: a checkpoint is " in err and "reaching --steps=8 needs 3 more on disk" in err
    assert len(records) == 1 and records[0]["checkpoints_needed"] == 3 and records[0]["checkpoints_room"] > 3
    step_bytes = records[0]["checkpoint_gib"] * 2**30
    AcceleratorState._reset_state(reset_partial_state=True)

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(0, 0, int(2.5 * step_bytes)))
    err, records = _run(root, tmp_path / "tight", capsys)
    assert "warning: the disk will fill before the run ends: " in err
    assert "room for 2 more; reaching --steps=8 needs 3 more on disk (--save_freq=2, --keep_last=0)" in err
    AcceleratorState._reset_state(reset_partial_state=True)

    err, records = _run(root, tmp_path / "kept", capsys, "--keep_last=1")  # 1 kept + 1 being written
    assert "room for 2 more; reaching --steps=8 needs 1 more on disk" in err and "warning" not in err
