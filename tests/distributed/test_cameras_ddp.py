"""Cameras on 2 processes: DDP over gloo trains a camera policy on the LeRobot-written video dataset,
frames decoded in DataLoader workers, cameras augmented; resumed from its step-2 checkpoint, it ends
with the weights of the uninterrupted run, so every rank trained on exactly the same samples, frames and
augmentations at every step. A data loader worker killed mid-run ends both ranks within the timeout,
each with one error line and no traceback."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file

from helpers.fixtures import copy_fixture
from helpers.launch import launch_env, no_traceback_from_us, run_torchrun, torchrun_command
from helpers.run_outputs import metrics_so_far, model_file
from helpers.train_flags import TINY_LEROBOT_ACT
from helpers.waiting import wait_for

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

TRAIN = Path(__file__).parent / "scripts" / "train_cli.py"
TESTS = Path(__file__).resolve().parents[1]


def _flags(tmp_path: Path, monkeypatch) -> list[str]:
    """A camera policy on the video fixture, one DataLoader worker per rank."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    root = copy_fixture(tmp_path, "lerobot", "dataset_video")
    return [
        f"--dataset.root={root}",
        "--policy.type=helpers.camera_policy:CameraPolicyConfig",
        "--policy.dropout=0",
        "--num_workers=1",
        "--use_policy_training_preset=false",
        "--scheduler.type=constant",
        "--batch_size=4",
    ]


def test_two_rank_camera_run_resumes_on_the_uninterrupted_samples(tmp_path, monkeypatch) -> None:
    flags = [*_flags(tmp_path, monkeypatch), "--dataset.image_transforms.enable=true"]
    flags += ["--save_freq=2", "--log_freq=2"]
    run_torchrun(TRAIN, 2, *flags, "--steps=4", f"--output_dir={tmp_path / 'straight'}")
    step_2 = tmp_path / "straight/checkpoints/000002/pretrained_model/train_config.json"
    resumed = ["--resume=true", f"--config_path={step_2}", f"--output_dir={tmp_path / 'cut'}"]
    resumed.append("--allow_types=helpers.camera_policy:CameraPolicyConfig")  # the saved config names it
    log = run_torchrun(TRAIN, 2, *resumed).stdout  # the straight run's steps 3 and 4, again
    assert "checkpoints/000002 at step 2" in log and no_traceback_from_us(log)
    weights = [load_file(model_file(tmp_path / run, 4)) for run in ("straight", "cut")]
    assert torch.equal(weights[0]["head.weight"], weights[1]["head.weight"])
    first = load_file(step_2.parent / "model.safetensors")
    assert not torch.equal(first["head.weight"], weights[1]["head.weight"])  # the resumed steps trained


def test_a_killed_worker_ends_both_ranks_in_one_line_each(tmp_path, monkeypatch) -> None:
    out = tmp_path / "run"
    flags = [*_flags(tmp_path, monkeypatch), "--steps=100000", "--save_freq=100000", "--log_freq=1"]
    command = torchrun_command(TRAIN, 2, *flags, "--collective_timeout_s=10", f"--output_dir={out}")
    launcher = subprocess.Popen(
        command, env=launch_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        wait_for(lambda: metrics_so_far(out, "train"), "first training record", process=launcher)
        ranks = psutil.Process(launcher.pid).children()
        workers = [worker for rank in ranks for worker in rank.children()]
        assert len(ranks) == 2 and len(workers) == 2  # one data loader worker per rank
        killed_at = time.monotonic()
        workers[0].kill()
        log, _ = launcher.communicate(timeout=90)
    finally:
        if launcher.poll() is None:
            for process in psutil.Process(launcher.pid).children(recursive=True):
                process.kill()
            launcher.kill()
    assert launcher.returncode != 0 and time.monotonic() - killed_at < 60, log
    errors = [line for line in log.splitlines() if "error: " in line]
    assert len(errors) == 2 and no_traceback_from_us(log), log
    assert any("a data loader worker stopped delivering batches within 10 s" in line for line in errors), log


def test_fsdp2_act_with_two_workers_on_the_video_fixture_resumes_sample_exact(tmp_path) -> None:
    """LeRobot's ACT (narrowed) on both cameras of the LeRobot-written video fixture, FSDP2 over 2
    ranks, two DataLoader workers per rank: resumed from step 2, it ends with the uninterrupted run's
    gathered weights bit for bit."""
    root = copy_fixture(tmp_path, "lerobot", "dataset_video")
    flags = [
        f"--dataset.root={root}",
        "--policy.type=act",
        *TINY_LEROBOT_ACT,
        "--policy.dropout=0",
        "--parallelism.dp_shard=2",
        "--num_workers=2",
        "--use_policy_training_preset=false",
        "--scheduler.type=constant",
        "--batch_size=2",
        "--save_freq=2",
        "--log_freq=2",
    ]
    run_torchrun(TRAIN, 2, *flags, "--steps=4", f"--output_dir={tmp_path / 'straight'}")
    step_2 = tmp_path / "straight/checkpoints/000002/pretrained_model/train_config.json"
    log = run_torchrun(
        TRAIN, 2, "--resume=true", f"--config_path={step_2}", f"--output_dir={tmp_path / 'cut'}"
    ).stdout
    assert "checkpoints/000002 at step 2" in log and no_traceback_from_us(log)
    assert "observation.images.top" in log and "observation.images.wrist" in log  # both cameras read
    straight, cut = (load_file(model_file(tmp_path / run, 4)) for run in ("straight", "cut"))
    assert straight.keys() == cut.keys() and all(torch.equal(straight[k], cut[k]) for k in straight)
    first = load_file(step_2.parent / "model.safetensors")
    assert any(not torch.equal(first[k], cut[k]) for k in first)  # the resumed steps trained
