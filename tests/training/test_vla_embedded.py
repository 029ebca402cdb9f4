"""SmolVLA on the embedded camera task with its language instruction (what `nox -s demo_vla` runs, at
2 steps): the embedded dataset gives each frame its task's instruction, the sim rollouts give it to the
policy at every step, and a run built on the demo's backbone (demo/tiny_smolvlm, no download) trains and
is scored by `trainer eval`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from helpers.fixtures import REPO
from trainer.cli.eval_command import run_eval
from trainer.cli.parse import parse_config
from trainer.data.dataset import ALL_CAMERAS, OBS_KEY, TASK_KEY, task_texts
from trainer.data.embedded import sim
from trainer.data.embedded.pendulum import PendulumConfig
from trainer.engine.plan import train
from trainer.evaluation.rollouts import rollout_returns

DEMO_BACKBONE = REPO / "demo" / "tiny_smolvlm"


@pytest.mark.parametrize("camera", [True, False])
def test_the_embedded_dataset_gives_each_frame_its_instruction(tmp_path: Path, camera: bool) -> None:
    config = PendulumConfig(episodes=2, camera=camera, cache_dir=str(tmp_path))
    features = [OBS_KEY, ALL_CAMERAS, TASK_KEY]
    dataset = config.load(features)
    indices = torch.tensor([0, 7, len(dataset) - 1])
    texts = task_texts(dataset.gather(indices, 3)[TASK_KEY])
    assert texts == [sim.instruction(camera)] * 3
    assert sim.instruction(True) != sim.instruction(False)
    assert TASK_KEY not in config.load([OBS_KEY, ALL_CAMERAS]).gather(indices, 3)  # only when asked


def test_rollouts_give_the_policy_the_instruction_with_the_frame() -> None:
    seen: list[dict] = []

    def act(observation: dict) -> np.ndarray:
        seen.append(observation)
        return np.zeros(sim.ACTION_DIM, dtype=np.float32)

    rollout_returns(act, episodes=1, world=1, rank=0, reduce=lambda t: t, camera=True)
    assert len(seen) > 1
    assert all(o[TASK_KEY] == sim.instruction(True) and o[sim.CAMERA].shape[-1] == 3 for o in seen)


def test_a_smolvla_run_on_the_camera_task_is_scored_by_trainer_eval(tmp_path: Path) -> None:
    """2 steps with the demo's backbone, then `trainer eval` rolls it out on the camera task: SmolVLA
    refuses a batch without its task, so the instruction reached it in training and in every rollout."""
    from accelerate.state import AcceleratorState

    flags = [
        "--policy.type=smolvla",
        f"--policy.vlm_model_name={DEMO_BACKBONE}",
        "--policy.num_vlm_layers=4",
        "--policy.chunk_size=5",
        "--policy.n_action_steps=5",
        "--policy.num_steps=2",
        "--policy.resize_imgs_with_padding=[32,32]",
        "--dataset.camera=true",
        "--dataset.episodes=2",
        "--dataset.eval_episodes=0",
        f"--dataset.cache_dir={tmp_path / 'cache'}",
        "--steps=2",
        "--batch_size=4",
        f"--output_dir={tmp_path / 'run'}",
    ]
    AcceleratorState._reset_state(reset_partial_state=True)
    train(parse_config(flags))
    AcceleratorState._reset_state(reset_partial_state=True)
    result = run_eval(
        [f"--policy.path={tmp_path / 'run' / 'checkpoints' / 'last'}", "--dataset.eval_episodes=1"]
    )
    assert result["episodes"] == 1
    assert np.isfinite(result["policy_return"]) and result["policy_return"] != result["random_return"]
