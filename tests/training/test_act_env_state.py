"""LeRobot's ACT from LeRobot's own flags on a dataset with `observation.environment_state` (its
dataset_tiny: state 4, environment state 3, no camera): the environment state is an encoder token of
its own, sized from the data and left unnormalized, as LeRobot's ACT reads it; the export holds the
tensors LeRobot 0.6.1 builds for the same data (names, dtypes and shapes recorded from LeRobot in
tests/fixtures/lerobot_act_env) and acts as the checkpoint does; flags that would build another model
are refused, or named at start. (That LeRobot itself loads the export strictly and acts as ours:
benchmarks/lerobot_side.py, `act_env`.)"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

import trainer
from helpers.fixtures import copy_fixture, fixture_dir
from helpers.train_flags import TINY_LEROBOT_ACT
from trainer.cli.parse import parse_config
from trainer.engine.plan import resolve_plan, train
from trainer.errors import ConfigError
from trainer.evaluation.lerobot_export import export_lerobot
from trainer.policies.act import ACTConfig
from trainer.policies.act import lerobot as act_lerobot

ENV, STATE = "observation.environment_state", "observation.state"
SAFETENSORS_DTYPES = {"float32": "F32"}


def _flags(root: Path, *extra: str) -> list[str]:
    """LeRobot's flags for its ACT on the dataset: no feature named, no environment-state flag."""
    return ["--policy.type=act", *TINY_LEROBOT_ACT, f"--dataset.root={root}", *extra]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Our ACT trained 2 steps from LeRobot's flags on dataset_tiny, and its `trainer export`."""
    from accelerate.state import AcceleratorState

    work = tmp_path_factory.mktemp("act_env")
    root = copy_fixture(work, "lerobot", "dataset_tiny")
    flags = _flags(root, "--batch_size=2", "--num_workers=0", "--steps=2", f"--output_dir={work / 'run'}")
    AcceleratorState._reset_state(reset_partial_state=True)
    train(parse_config(flags))
    AcceleratorState._reset_state(reset_partial_state=True)
    step = work / "run" / "checkpoints" / "last"
    export_lerobot(str(step), str(work / "lerobot"))
    return step, work / "lerobot"


def test_lerobots_flags_build_the_environment_state_as_its_own_token(run) -> None:
    policy = trainer.load_policy(str(run[0])).policy
    assert policy.config.input_features == [STATE, ENV]
    assert (policy.config.obs_dim, policy.config.env_state_dim, policy.robot_dim) == (7, 3, 4)
    assert tuple(policy.encoder_env_state_input_proj.weight.shape) == (16, 3)
    assert policy.encoder_1d_feature_pos_embed.num_embeddings == 3  # latent, robot state, environment


def test_the_environment_state_trains_unnormalized_as_lerobot_leaves_env(run) -> None:
    stats = trainer.load_policy(str(run[0])).preprocessor.steps[0].stats[STATE]
    assert torch.equal(stats["mean"][4:], torch.zeros(3)) and torch.equal(stats["std"][4:], torch.ones(3))
    assert not torch.equal(stats["std"][:4], torch.ones(4))  # the robot state is normalized


def test_the_export_holds_the_tensors_lerobot_builds_for_the_same_data(run) -> None:
    """LeRobot 0.6.1's ACTPolicy for dataset_tiny's features at these sizes: the same names, dtypes
    and shapes (what `from_pretrained(strict=True)` needs), and its config's features and mapping."""
    recorded = json.loads((Path(fixture_dir("lerobot_act_env")) / "state_shapes.json").read_text())
    with safe_open(str(run[1] / "model.safetensors"), "pt") as handle:
        headers = {
            name: (handle.get_slice(name).get_dtype(), list(handle.get_slice(name).get_shape()))
            for name in handle.keys()  # noqa: SIM118
        }
    assert headers == {n: (SAFETENSORS_DTYPES[d], shape) for n, (d, shape) in recorded["tensors"].items()}
    config = json.loads((run[1] / "config.json").read_text())
    assert config["input_features"] == {
        STATE: {"type": "STATE", "shape": [4]},
        ENV: {"type": "ENV", "shape": [3]},
    }
    assert config["normalization_mapping"] == recorded["normalization_mapping"]  # no ENV entry


def test_the_export_acts_as_the_checkpoint(run) -> None:
    """A raw observation (the environment state at its own scale) through each one's processors."""
    generator = torch.Generator().manual_seed(0)
    observation = {
        STATE: torch.randn(3, 4, generator=generator),
        ENV: 5 * torch.randn(3, 3, generator=generator),
    }
    ours, exported = trainer.load_policy(str(run[0])), trainer.load_policy(str(run[1]))
    assert torch.equal(ours.select_action(observation), exported.select_action(observation))
    moved = {**observation, ENV: observation[ENV] + 1}
    ours.reset()
    assert not torch.equal(ours.select_action(observation), ours.select_action(moved))


def test_the_environment_state_listed_before_the_robot_state_is_refused(tmp_path: Path) -> None:
    root = copy_fixture(tmp_path, "lerobot", "dataset_tiny")
    flags = _flags(root, f"--policy.input_features=[{ENV},{STATE}]", f"--output_dir={tmp_path / 'run'}")
    with pytest.raises(ConfigError, match=rf"lists {ENV} before {STATE}: .* list it last"):
        resolve_plan(parse_config(flags), 1)


def test_an_environment_state_width_that_is_not_the_datas_is_refused(tmp_path: Path) -> None:
    root = copy_fixture(tmp_path, "lerobot", "dataset_tiny")
    flags = _flags(root, "--policy.env_state_dim=2", f"--output_dir={tmp_path / 'run'}")
    with pytest.raises(ConfigError, match=rf"env_state_dim=2, but the data's {ENV} holds 3 values"):
        resolve_plan(parse_config(flags), 1)


def test_a_model_reading_it_inside_the_state_is_named_at_start_and_not_exported(tmp_path: Path) -> None:
    """Sizes already fixed (a checkpoint's config, here the flags) with env_state_dim 0: the model it
    was trained as is kept, the start banner says it is not LeRobot's, the export refuses it."""
    root = copy_fixture(tmp_path, "lerobot", "dataset_tiny")
    flags = _flags(root, "--policy.obs_dim=7", "--policy.action_dim=2", f"--output_dir={tmp_path / 'run'}")
    plan, _ = resolve_plan(parse_config(flags), 1)
    config = plan.policy.policy
    assert isinstance(config, ACTConfig) and config.env_state_dim == 0
    assert any(f"reads {ENV} inside {STATE}" in note for note in plan.notes)
    with pytest.raises(ConfigError, match=rf"reads {ENV} inside {STATE} \(env_state_dim 0\)"):
        act_lerobot.config_to_lerobot(dataclasses.asdict(config))


def test_lerobots_own_env_state_checkpoint_keeps_its_numbers() -> None:
    """LeRobot's checkpoint of the same kind (checkpoint_act) still reads as env_state_dim 3 and its
    tensors arrive whole (the concatenated batch, split by the model)."""
    model = Path(fixture_dir("lerobot", "checkpoint_act")) / "checkpoints" / "000002" / "pretrained_model"
    loaded = trainer.load_policy(str(model))
    assert loaded.policy.config.env_state_dim == 3
    theirs = load_file(str(model / "model.safetensors"))
    assert torch.equal(
        loaded.policy.encoder_env_state_input_proj.weight, theirs["model.encoder_env_state_input_proj.weight"]
    )
