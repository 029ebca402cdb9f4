"""Two robots that differ in one run, FSDP2 on 2 gloo ranks (scripts/embodiments_run.py, one torchrun
launch): a tiny SmolVLA on LeRobot's `dataset_video` (state 4, action 2, two video cameras, 10 fps)
beside LeRobot's `dataset_arm6` (state 6, action 3, one image camera, 15 fps). It trains, resumes bit
for bit, draws the same samples of each member at every step (also resumed on one process), logs
val_loss and samples per member, and the sharded model's padded action dims get exactly zero gradient
from the smaller robot's samples."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers.engine_run import train_in
from helpers.fixtures import copy_fixture, fixture_dir
from helpers.launch import no_traceback_from_us, run_torchrun
from helpers.run_outputs import metrics, model_file

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

SCRIPT = Path(__file__).parent / "scripts" / "embodiments_run.py"
VIDEO, ARM6 = "dataset_video", "dataset_arm6"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    work = tmp_path_factory.mktemp("embodiments_sharded")
    for name in (VIDEO, ARM6):
        copy_fixture(work, "lerobot", name)
    shutil.copytree(fixture_dir("lerobot_smolvla_tiny", "tiny_smolvlm"), work / "tiny_smolvlm")
    (work / "mixture.json").write_text(json.dumps([{"root": VIDEO}, {"root": ARM6}]))
    log = run_torchrun(SCRIPT, 2, str(work / "out"), str(work), timeout=300).stdout
    return work, log


def _records(run: Path, event: str) -> dict[int, dict]:
    return {r["step"]: r for r in metrics(run, event)}


def _samples(run: Path) -> dict[int, tuple[int, int]]:
    return {step: (r[f"samples/{VIDEO}"], r[f"samples/{ARM6}"]) for step, r in _records(run, "train").items()}


def _weights(run: Path, step: str) -> dict[str, torch.Tensor]:
    return load_file(str(model_file(run, step)))


def test_the_sharded_run_of_two_robots_resumes_bit_for_bit(runs) -> None:
    work, log = runs
    assert "FSDP2 2 (2 processes" in log and no_traceback_from_us(log)
    out = work / "out"
    straight, resumed = _weights(out / "straight", "000004"), _weights(out / "resumed", "000004")
    assert straight.keys() == resumed.keys() and all(torch.equal(straight[k], resumed[k]) for k in straight)
    at_two = _weights(out / "straight", "000002")
    assert not all(torch.equal(straight[k], at_two[k]) for k in straight)  # the resumed steps trained
    config = json.loads((out / "resumed/checkpoints/000004/pretrained_model/config.json").read_text())
    assert config["input_features"]["observation.state"]["shape"] == [6]
    assert config["output_features"]["action"]["shape"] == [3]


def test_every_step_draws_the_same_samples_of_each_robot_and_logs_val_loss_per_robot(runs) -> None:
    work, _ = runs
    straight, resumed = work / "out" / "straight", work / "out" / "resumed"
    samples = _samples(straight)
    assert sorted(samples) == [1, 2, 3, 4] and all(sum(counts) == 4 for counts in samples.values())
    assert all(sum(counts[k] for counts in samples.values()) > 0 for k in (0, 1))  # both robots drawn
    assert _samples(resumed) == samples  # steps 1 and 2 as copied, 3 and 4 as the resumed run drew them
    val = _records(straight, "val")
    assert sorted(val) == [2, 4]
    for record in val.values():  # --max_eval_samples=4: 2 held-out frames of each robot, a plain mean
        members = record[f"val_loss/{VIDEO}"], record[f"val_loss/{ARM6}"]
        assert record["val_loss"] == pytest.approx(sum(members) / 2, rel=1e-12) and members[0] != members[1]
    assert _records(resumed, "val")[4] == val[4]  # the resumed run's weights are the straight run's


def test_the_smaller_robots_samples_give_its_padded_action_dims_exactly_zero_gradient(runs) -> None:
    """The full (gathered) gradient of the sharded action output projection: rows 2.. (dim 2 is the
    video robot's padding, 3..31 SmolVLA's max_action_dim padding) get none from the video robot's
    samples; the 3-action robot gives row 2 a real one."""
    work, _ = runs
    grads = torch.load(work / "out" / "grads.pt")
    assert grads["video.weight"].shape == (32, 48)  # max_action_dim x the expert's width
    assert not grads["video.weight"][2:].any() and not grads["video.bias"][2:].any()
    assert grads["video.weight"][:2].abs().sum() > 0
    assert grads["arm6.weight"][2].abs().sum() > 0 and not grads["arm6.weight"][3:].any()


def test_resumed_on_one_process_it_draws_the_same_samples_of_each_robot(runs, tmp_path) -> None:
    """The order is the ranks' own (docs/resume.md): the 2-rank run's step 2 resumed on one process
    with the same global batch (4) draws the same samples of each member at steps 3 and 4."""
    work, _ = runs
    step_2 = work / "out/straight/checkpoints/000002/pretrained_model/train_config.json"
    flags = ["--resume=true", f"--config_path={step_2}", f"--output_dir={tmp_path / 'single'}"]
    train_in(work, [*flags, "--batch_size=4", "--parallelism.dp_shard=1"])
    expected = _samples(work / "out" / "straight")
    assert _samples(tmp_path / "single") == {step: expected[step] for step in (3, 4)}
