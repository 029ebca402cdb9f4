"""A weighted mixture on 2 gloo ranks (scripts/mixture_resume.py, one torchrun launch): LeRobot's ACT
(narrowed) on the video and the image fixtures drawn 3:1, frames decoded in a DataLoader worker per
rank. 6 steps straight and 3 steps resumed to 6 from train_config.json alone (the mixture file gone)
end with the same weights, bit for bit, and draw the same samples of each member at every step; step 3
resumed on one process with the same global batch draws them too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from helpers.fixtures import copy_fixture
from helpers.launch import no_traceback_from_us, run_torchrun
from helpers.run_outputs import metrics, model_file
from helpers.train_flags import TINY_LEROBOT_ACT

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

SCRIPT = Path(__file__).parent / "scripts" / "mixture_resume.py"
TRAIN = Path(__file__).parent / "scripts" / "train_cli.py"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("mixture")
    for name in ("dataset_video", "dataset_images"):
        copy_fixture(out, "lerobot", name)
    mixture = out / "mixture.json"
    mixture.write_text(
        json.dumps([{"root": "dataset_video", "weight": 3}, {"root": "dataset_images", "weight": 1}])
    )
    log = run_torchrun(SCRIPT, 2, str(out), str(mixture), *TINY_LEROBOT_ACT, timeout=300).stdout
    return out, log


def _samples(run: Path) -> dict[int, tuple[int, int]]:
    records = metrics(run)
    return {
        r["step"]: (r["samples/dataset_video"], r["samples/dataset_images"])
        for r in records
        if r.get("event") == "train"
    }


def test_a_resumed_mixture_run_ends_with_the_straight_runs_weights(runs) -> None:
    out, log = runs
    assert "checkpoints/000003 at step 3" in log and no_traceback_from_us(log)
    straight, cut = (load_file(model_file(out / run, 6)) for run in ("straight", "cut"))
    assert straight.keys() == cut.keys() and all(straight[k].equal(cut[k]) for k in straight)
    third = load_file(out / "cut/checkpoints/000003/pretrained_model/model.safetensors")
    assert any(not third[k].equal(cut[k]) for k in third)  # the resumed steps trained


def test_every_step_draws_the_same_samples_of_each_member(runs) -> None:
    out, _ = runs
    straight, cut = _samples(out / "straight"), _samples(out / "cut")
    assert sorted(straight) == sorted(cut) == list(range(1, 7))
    assert straight == cut and all(sum(counts) == 4 for counts in straight.values())  # 2 ranks x 2
    video, images = (sum(counts[k] for counts in straight.values()) for k in (0, 1))
    assert video > images  # drawn 3:1 (24 samples: the epoch's exact shares are 90:30)


def test_val_loss_is_logged_per_member(runs) -> None:
    out, _ = runs
    records = {run: metrics(out / run) for run in ("straight", "cut")}
    val = {run: {r["step"]: r for r in rs if r.get("event") == "val"} for run, rs in records.items()}
    assert sorted(val["straight"]) == [3, 6] and sorted(val["cut"]) == [3, 6]
    for record in val["straight"].values():  # 20 held-out frames each: the plain mean of the two
        members = record["val_loss/dataset_video"], record["val_loss/dataset_images"]
        assert record["val_loss"] == pytest.approx(sum(members) / 2, rel=1e-12) and members[0] != members[1]
        # ACT's held-out loss is its L1 (no KL in eval mode): its own metric, weighted and reduced alike
        assert record["val_l1_loss"] == pytest.approx(record["val_loss"], rel=1e-12)
    assert val["straight"][6] == val["cut"][6]  # the resumed run's weights are the straight run's


def test_the_checkpoint_records_the_members_not_the_file(runs) -> None:
    out, _ = runs
    saved = json.loads((out / "cut/checkpoints/000006/pretrained_model/train_config.json").read_text())
    members = saved["dataset"]["members"]
    assert saved["dataset"]["type"] == "mixture" and saved["dataset"]["mixture"] is None
    assert [(Path(m["root"]).name, m["weight"]) for m in members] == [
        ("dataset_video", 3.0),
        ("dataset_images", 1.0),
    ]


def test_resumed_on_one_process_it_trains_on_the_same_samples(runs, tmp_path) -> None:
    """The documented guarantee across a topology change (docs/resume.md): the 2-rank run's step 3
    resumed on one process with the same global batch (4) draws the same samples of each member at
    every step, and its losses agree with the 2-rank run's within fp32 rounding of another reduction
    order (1e-5 relative, as tests/distributed/test_resume.py; a wrong sample moves them by > 1e-3)."""
    out, _ = runs
    step_3 = out / "straight/checkpoints/000003/pretrained_model/train_config.json"
    single = tmp_path / "single"
    flags = ["--resume=true", f"--config_path={step_3}", f"--output_dir={single}", "--batch_size=4"]
    log = run_torchrun(TRAIN, 1, *flags).stdout
    assert "checkpoints/000003 at step 3" in log and no_traceback_from_us(log)
    # a one-process launch runs as a plain process: no process group of one, no DDP wrapper (whose
    # gradient buckets cost 4 B per parameter; docs/large-models.md)
    assert "single process (1 process, device cpu)" in log
    expected = _samples(out / "straight")
    assert _samples(single) == {step: expected[step] for step in (4, 5, 6)}
    losses = {run: _losses(run) for run in (out / "straight", single)}
    resumed = losses[single]
    assert sorted(resumed) == [4, 5, 6]
    for step, loss in resumed.items():
        assert loss == pytest.approx(losses[out / "straight"][step], rel=1e-5), (step, losses)


def _losses(run: Path) -> dict[int, float]:
    records = metrics(run)
    return {r["step"]: r["loss"] for r in records if r.get("event") == "train"}
