"""A new policy is one folder plus one registration line (docs/add_a_policy.md): the toy policy in
tests/helpers/toy_policy/ uses every hook of the contract, observation history included, and trains,
saves, resumes bit for bit and acts through the engine with no other change."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import trainer
from helpers import toy_policy
from helpers.run_outputs import model_file
from helpers.toy_policy import policy as toy
from helpers.train_flags import tiny_args
from trainer.cli.parse import parse_config
from trainer.distributed.wrap import resolve_wrap_plan
from trainer.engine.plan import train
from trainer.policies import build_policy

TOY = ("--policy.type=toy", "--save_freq=2")


def _weights(out: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(model_file(out, step))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, dataset_cache: str) -> tuple[Path, Path]:
    """An uninterrupted 4-step run, and one stopped at step 2 then resumed to 4."""
    root = tmp_path_factory.mktemp("toy")
    toy.SEEN.clear()
    train(parse_config(tiny_args(str(root / "whole"), dataset_cache, *TOY)))
    train(parse_config(tiny_args(str(root / "split"), dataset_cache, *TOY, "--steps=2")))
    train(parse_config(["--resume=true", "--steps=4", f"--output_dir={root / 'split'}"]))
    return root / "whole", root / "split"


def test_the_data_layer_gives_the_frames_the_policy_declares(runs) -> None:
    """2 observation frames and the action frames from the first of them, each with its pad mask."""
    assert toy.SEEN and all(
        shapes["observation.state"] == (8, 2, 3)
        and shapes["observation.state_is_pad"] == (8, 2)
        and shapes["action"] == (8, 3, 1)
        and shapes["action_is_pad"] == (8, 3)
        for shapes in toy.SEEN
    )


def test_it_resumes_bit_for_bit(runs) -> None:
    whole, split = runs
    expected, resumed = _weights(whole, 4), _weights(split, 4)
    assert expected.keys() == resumed.keys()
    assert all(torch.equal(expected[name], resumed[name]) for name in expected)
    assert not all(torch.equal(expected[name], _weights(whole, 2)[name]) for name in expected)  # it trained


def test_it_acts_from_its_checkpoint_with_its_history(runs) -> None:
    whole, _ = runs
    policy = trainer.load_policy(str(whole / "checkpoints" / "last"))
    first = policy.select_action({"observation.state": [1.0, 0.0, 0.5]})
    second = policy.select_action({"observation.state": [0.0, 1.0, -0.5]})
    assert first.shape == second.shape == (1,) and torch.isfinite(second).all()
    assert not torch.equal(first, second)


def test_its_declared_units_and_groups_are_the_engines() -> None:
    config = toy_policy.ToyConfig(obs_dim=3, action_dim=1)
    policy = build_policy(config, 3, 1)
    assert resolve_wrap_plan(policy, parse_config([]).accelerator.fsdp).class_names == ("ToyBlock",)
    assert policy.peft_target_modules() == ("proj",) and policy.parameter_groups() == {"encoder": 1e-3}
    assert config.frames.observation == (-1, 0) and config.frames.action == (-1, 0, 1)
