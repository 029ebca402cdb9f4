"""loss_curve.png and the summary read the whole run from metrics.jsonl, across resumes."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt

from trainer.reporting.loss_curve import History, draw, read_history


def _write(path: Path, *records: dict) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def _train(step: int, loss: float) -> dict:
    return {"event": "train", "step": step, "loss": loss}


def test_history_spans_resumes_and_drops_what_a_crash_logged_after_its_checkpoint(tmp_path) -> None:
    path = tmp_path / "metrics.jsonl"
    _write(
        path,
        {"event": "start", "banner": ["old run"]},
        _train(2, 9.0),  # an older run in the same directory, started over: not part of this history
        {"event": "start", "banner": ["first segment"]},
        _train(2, 1.0),
        _train(4, 0.8),
        {"event": "val", "step": 4, "val_loss": 0.9},  # what the loop's held-out evaluation writes
        _train(6, 0.7),  # logged, then the job died before the step-6 checkpoint
        {"event": "start", "banner": ["resumed"]},
        {"event": "resume", "step": 4, "changes": []},
        _train(6, 0.65),
        _train(8, 0.5),
        {"event": "val", "step": 8, "val_loss": 0.6},
    )
    history = read_history(path)
    assert history.loss == [(2, 1.0), (4, 0.8), (6, 0.65), (8, 0.5)]
    assert history.val_loss == [(4, 0.9), (8, 0.6)]
    assert history.resumes == [4]


def test_the_figure_has_title_labels_resume_marks_and_validation() -> None:
    history = History(loss=[(2, 1.0), (4, 0.8), (6, 0.6)], val_loss=[(4, 0.9)], resumes=[4])
    fig = draw(history, "demo: loss over the whole run")
    ax = fig.axes[0]
    assert ax.get_title() == "demo: loss over the whole run"
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("loop step", "loss (mean over ranks)")
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines["loss"].get_xdata()) == [2, 4, 6] and list(lines["val_loss"].get_xdata()) == [4]
    assert list(lines["resumed"].get_xdata()) == [4, 4]
    plt.close(fig)


def test_a_one_point_run_shows_its_point() -> None:
    fig = draw(History(loss=[(1, 0.5)]), "one step")
    (line,) = fig.axes[0].get_lines()
    assert list(line.get_xdata()) == [1] and line.get_marker() not in (None, "None", "", " ")
    plt.close(fig)


def test_every_steps_loss_is_read_across_a_resume_and_drawn(tmp_path) -> None:
    """The `step_losses` record beside each log line holds the window's steps, ending at its step; a
    crashed segment's steps after the checkpoint are dropped like its logged points."""
    path = tmp_path / "metrics.jsonl"
    _write(
        path,
        {"event": "start", "banner": ["first segment"]},
        {"event": "step_losses", "step": 2, "losses": [1.2, 1.0]},
        _train(2, 1.1),
        {"event": "step_losses", "step": 4, "losses": [0.9, 0.8]},
        _train(4, 0.85),
        {"event": "start", "banner": ["resumed"]},
        {"event": "resume", "step": 2, "changes": []},
        {"event": "step_losses", "step": 4, "losses": [0.95, 0.7]},
        _train(4, 0.825),
    )
    history = read_history(path)
    assert history.step_loss == [(1, 1.2), (2, 1.0), (3, 0.95), (4, 0.7)]
    assert history.loss == [(2, 1.1), (4, 0.825)]
    fig = draw(history, "every step")
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    assert list(lines["loss (every step)"].get_xdata()) == [1, 2, 3, 4]
    assert list(lines["loss"].get_xdata()) == [2, 4]
    plt.close(fig)
