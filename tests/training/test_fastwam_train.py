"""`trainer train --policy.type=fastwam` from scratch on the dataset LeRobot trained its fixture on
(tests/fixtures/lerobot_fastwam_tiny/dataset): the video window arrives through the observation-history
contract (a batch of another frame count is refused by the policy), its loss parts reach metrics.jsonl,
its frozen text encoder is released before step 1, the checkpoint holds the trainable tensors only, and it
acts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import trainer
from helpers.engine_run import train_in
from helpers.fixtures import copy_fixture
from trainer.policies.fastwam.policy import FastWAMPolicy

TINY = [
    "--policy.type=fastwam", "--policy.torch_dtype=float32", "--policy.base_model_id=null",
    "--policy.text_encoder_model_id=./tiny_wan", "--policy.tokenizer_model_id=./tiny_wan/tokenizer",
    "--policy.num_video_frames=9", "--policy.action_video_freq_ratio=2", "--policy.action_horizon=8",
    "--policy.n_action_steps=8", "--policy.image_size=[64,96]", "--policy.tokenizer_max_len=32",
    "--policy.num_inference_steps=2",
    '--policy.video_dit_config={"hidden_dim": 32, "ffn_dim": 64, "freq_dim": 16, "text_dim": 16, "num_heads": 2, "attn_head_dim": 16, "num_layers": 2}',
    '--policy.action_dit_config={"hidden_dim": 24, "ffn_dim": 48, "num_heads": 2, "attn_head_dim": 16, "num_layers": 2, "text_dim": 16, "freq_dim": 16}',
    "--dataset.repo_id=local/fastwam_tiny", "--dataset.root=dataset", "--batch_size=2", "--num_workers=0",
    "--steps=2", "--save_freq=2", "--log_freq=1", "--seed=3",
]  # fmt: skip


def test_fastwam_trains_from_scratch_and_acts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    work = copy_fixture(tmp_path, "lerobot_fastwam_tiny")
    prepared = []  # (the tasks the engine handed over, whether the text encoder was held after)

    def prepare_tasks(self: FastWAMPolicy, tasks: list[str], device: torch.device) -> None:
        original(self, tasks, device)
        prepared.append((list(tasks), self.frozen_parts(device).text_encoder is not None))

    original = FastWAMPolicy.prepare_tasks
    monkeypatch.setattr(FastWAMPolicy, "prepare_tasks", prepare_tasks)
    train_in(work, [*TINY, "--output_dir=out"])
    # once, before step 1, with the dataset's distinct tasks: the encoder gone for the whole run
    assert prepared == [(["push the red block to the goal", "open the drawer"], False)]
    run = work / "out"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r.get("event") == "train"]
    assert len(train) == 2
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in train)
    # The policy's two parts reach the log, and (one step per window, lambdas 1) they add up to the loss.
    for record in train:
        assert record["loss_video"] > 0 and record["loss_action"] > 0
        assert record["loss"] == pytest.approx(record["loss_video"] + record["loss_action"], rel=1e-5)
    saved = load_file(str(run / "checkpoints" / "000002" / "pretrained_model" / "model.safetensors"))
    lerobots = load_file(str(work / "pretrained_model" / "model.safetensors"))
    assert {k: v.shape for k, v in saved.items()} == {k: v.shape for k, v in lerobots.items()}
    monkeypatch.chdir(work)
    policy = trainer.load_policy("out/checkpoints/last")
    observation = {
        "observation.state": torch.zeros(5).tolist(),
        "observation.images.front": torch.rand(3, 64, 96),
        "task": "open the drawer",
    }
    assert policy.select_action(observation).shape == (3,)


def test_only_a_policy_that_takes_tasks_makes_the_engine_ask_the_data_for_them() -> None:
    """A dataset plug-in need not list its tasks unless the policy uses them (`Policy.takes_tasks`):
    FastWAM does (its prompts are encoded before step 1); the MLP and ACT do not."""
    from trainer.policies.act.policy import ACTPolicy
    from trainer.policies.mlp.policy import MLPPolicy

    assert FastWAMPolicy.takes_tasks(FastWAMPolicy.__new__(FastWAMPolicy))
    assert not MLPPolicy.takes_tasks(MLPPolicy.__new__(MLPPolicy))
    assert not ACTPolicy.takes_tasks(ACTPolicy.__new__(ACTPolicy))
