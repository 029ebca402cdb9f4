"""Cameras on 2 processes: DDP over gloo trains a camera policy on the LeRobot-written video dataset,
frames decoded in DataLoader workers, cameras augmented; a run interrupted and resumed ends with the
weights of the uninterrupted run, so every rank trained on exactly the same samples, frames and
augmentations at every step."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers.fixtures import copy_fixture
from helpers.launch import no_traceback_from_us, run_torchrun

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

TRAIN = Path(__file__).parent / "scripts" / "train_cli.py"
TESTS = Path(__file__).resolve().parents[1]


def test_two_rank_camera_run_resumes_on_the_uninterrupted_samples(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    root = copy_fixture(tmp_path, "lerobot", "dataset_video")
    flags = [
        f"--dataset.root={root}",
        "--policy.type=helpers.camera_policy:CameraPolicyConfig",
        "--policy.dropout=0",
        "--dataset.image_transforms.enable=true",
        "--num_workers=1",
        "--scheduler.type=constant",
        "--batch_size=4",
        "--save_freq=2",
        "--log_freq=2",
    ]
    run_torchrun(TRAIN, 2, *flags, "--steps=4", f"--output_dir={tmp_path / 'straight'}")
    run_torchrun(TRAIN, 2, *flags, "--steps=2", f"--output_dir={tmp_path / 'cut'}")
    log = run_torchrun(TRAIN, 2, "--resume=true", "--steps=4", f"--output_dir={tmp_path / 'cut'}").stdout
    assert "resuming from" in log and no_traceback_from_us(log)
    weights = [
        load_file(tmp_path / run / "checkpoints/000004/pretrained_model/model.safetensors")
        for run in ("straight", "cut")
    ]
    assert torch.equal(weights[0]["head.weight"], weights[1]["head.weight"])
    first = load_file(tmp_path / "cut/checkpoints/000002/pretrained_model/model.safetensors")
    assert not torch.equal(first["head.weight"], weights[1]["head.weight"])  # the resumed steps trained
