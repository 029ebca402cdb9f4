"""Real data in, a usable policy out, on 2 processes: FSDP2 trains ACT on a multi-file LeRobotDataset
read through the Hugging Face cache (offline), with held-out episodes; its val_loss falls, `trainer
eval` (2 processes) beats the mean predictor on the held-out episodes, and the DCP step, its
converted export and its published copy give the same actions through `trainer.load_policy`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import trainer
from helpers.hf_cache import put_in_hub_cache
from helpers.launch import CKPT_CLI, run_torchrun
from helpers.lerobot_data import STATE, VELOCITY, write_dataset
from helpers.run_outputs import metrics

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

TRAIN = Path(__file__).parent / "scripts" / "train_cli.py"
EVAL = Path(__file__).parent / "scripts" / "eval_cli.py"
REPO_ID = "me/turning-points"


def test_fsdp2_lerobot_run_to_a_policy_that_acts(tmp_path, monkeypatch) -> None:
    hf_home = tmp_path / "hf_home"
    write_dataset(tmp_path / "ds", [60] * 6, rows_per_file=70)  # 6 files: episodes span files
    put_in_hub_cache(tmp_path / "ds", REPO_ID, repo_type="dataset", cache=str(hf_home / "hub"))
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # resolved from the cache alone, by the first rank
    out = tmp_path / "run"
    train_log = run_torchrun(
        TRAIN,
        2,
        f"--dataset.repo_id={REPO_ID}",
        "--dataset.val_episodes=[4,5]",
        "--parallelism.dp_shard=2",
        "--checkpoint_format=dcp",
        "--policy.dropout=0",
        "--use_policy_training_preset=false",
        "--scheduler.warmup_steps=0",
        "--optimizer.lr=0.003",
        "--batch_size=16",
        "--steps=60",
        "--eval_freq=10",
        "--log_freq=20",
        "--save_freq=60",
        f"--output_dir={out}",
        timeout=280,
    ).stdout
    assert "cameras: observation.images.front (image)" in train_log
    records = metrics(out)
    val = [r["val_loss"] for r in records if r.get("event") == "val"]
    assert len(val) == 6 and val[-1] < 0.9 * val[0] and min(val[3:]) < min(val[:3]), val

    step = out / "checkpoints" / "000060"
    assert not (step / "pretrained_model" / "model.safetensors").exists()  # DCP only
    eval_log = run_torchrun(EVAL, 2, f"--policy.path={step}", "--dataset.episodes=[4,5]", "--json").stdout
    result = json.loads(next(line for line in eval_log.splitlines() if line.startswith("{")))
    assert (result["episodes"], result["frames"]) == (2, 120)
    assert result["action_mse"] < 0.7 * result["baseline_mse"], result

    exported, published = tmp_path / "exported", tmp_path / "published"
    subprocess.run([str(CKPT_CLI), "convert", str(step), "--output", str(exported)], check=True)
    subprocess.run([str(CKPT_CLI), "push", str(exported), str(published)], check=True)
    rng = np.random.default_rng(0)
    observation = {STATE: rng.standard_normal((5, 4)), VELOCITY: rng.standard_normal((5, 2))}
    actions = [trainer.load_policy(str(p)).select_action(observation) for p in (step, exported, published)]
    assert torch.equal(actions[0], actions[1]) and torch.equal(actions[0], actions[2])
