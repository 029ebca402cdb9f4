"""Checkpoints written before ACT became LeRobot's ACT (tests/fixtures/legacy, commit 3d11015) still
load with `load_policy` (acting as they did, to float32 rounding), evaluate with `trainer eval`, start a
run with `--policy.path` and resume: a `type: act` config with the old fields is the `act_state` policy."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

import trainer
from helpers.fixtures import copy_fixture, fixture_dir
from helpers.numerics import EPS, largest_magnitude
from helpers.run_outputs import saved_model
from trainer.cli.eval_command import run_eval
from trainer.cli.parse import parse_config
from trainer.engine.plan import train
from trainer.policies import upgrade_policy_config

EXPECTED = json.loads((fixture_dir("legacy") / "actions.json").read_text())


def _step(kind: str) -> str:
    return str(fixture_dir("legacy", f"checkpoint_{kind}") / "checkpoints" / "000002")


# The stored actions are float32 results of commit 3d11015 on the CPU that wrote them (an AVX-512 one):
# one rounding of the function the checkpoint's weights define, in the order that CPU's kernels summed.
# AVX2, AMX or ATen's plain loops sum in other orders and land 1-2 float32 ulps away, so the stored
# actions are not compared bit for bit with today's, but each with the float64 evaluation of the same
# loaded policy (exact to ~1e-16 on any CPU). A float32 evaluation of these two-layer networks is a
# chain of a few dozen rounded operations (normalize, dot products of at most 16 terms, softmax or GELU,
# layer norm, unnormalize), each off by at most U = EPS/2 relative to its result, on values no larger
# than the largest magnitude the computation passes through (M, measured on the float64 run); with the
# first-order propagation of those errors that is well inside 32 ulps of M: EPS * 32 * M (1.4e-5 here,
# against 1-2 ulps of the largest action measured on AVX-512, AVX2 and the default kernels, 5e-8). A
# policy read wrongly (a weight swapped or left at its initial value, a statistic or a layer missed)
# moves the actions by orders of magnitude more.
ROUNDING_ULPS = 32


@pytest.mark.numerics
@pytest.mark.parametrize("kind", ["act", "mlp"])
def test_old_checkpoint_acts_as_it_did(kind) -> None:
    loaded = trainer.load_policy(_step(kind))
    assert loaded.config.type == ("act_state" if kind == "act" else "mlp")
    obs = np.array(EXPECTED["observation.state"], dtype=np.float32)
    exact_policy = copy.deepcopy(loaded.policy).double()

    def exact_actions() -> torch.Tensor:
        normalized = loaded.preprocessor({"observation.state": torch.from_numpy(obs).double()})
        with torch.no_grad():
            return loaded.postprocessor({"action": exact_policy.select_action(normalized)})["action"]

    scale = largest_magnitude(exact_policy, exact_actions)
    exact = exact_actions()
    assert exact.dtype == torch.float64
    tolerance = ROUNDING_ULPS * EPS * scale
    stored = torch.tensor(EXPECTED[kind], dtype=torch.float32)
    today = loaded.select_action({"observation.state": obs})
    assert today.dtype == torch.float32 and today.shape == stored.shape
    for name, actions in (("stored", stored), ("today's", today)):
        off = float((actions.double() - exact).abs().max())
        assert off <= tolerance, f"{name} actions are {off:.3g} from float64's, over {tolerance:.3g}"


def test_only_the_old_act_fields_mean_act_state() -> None:
    assert upgrade_policy_config({"type": "act", "dim": 8})["type"] == "act_state"
    new = {"type": "act", "dim_model": 8}
    assert upgrade_policy_config(new) is new
    assert upgrade_policy_config({"type": "mlp", "hidden_dim": 8})["type"] == "mlp"


def test_old_checkpoint_evaluates(tmp_path) -> None:
    result = run_eval(
        [f"--policy.path={_step('act')}", f"--dataset.cache_dir={tmp_path}", "--dataset.eval_episodes=1"]
    )
    assert result["episodes"] == 1 and np.isfinite(result["policy_return"])


@pytest.mark.parametrize("kind", ["act", "mlp"])
def test_old_checkpoint_starts_a_run_and_resumes(kind, tmp_path, dataset_cache, clean_accelerate) -> None:
    common = [f"--dataset.cache_dir={dataset_cache}", "--dataset.episodes=2", "--dataset.eval_episodes=0"]
    config = parse_config(
        [f"--policy.path={_step(kind)}", *common, "--steps=1", f"--output_dir={tmp_path / 'ft'}"]
    )
    assert config.policy.type == ("act_state" if kind == "act" else "mlp")
    assert train(config).steps == 1
    run = copy_fixture(tmp_path, "legacy", f"checkpoint_{kind}")
    resumed = parse_config(["--resume=true", f"--output_dir={run}", *common, "--steps=3", "--save_freq=3"])
    assert resumed.policy.type == ("act_state" if kind == "act" else "mlp")
    summary = train(resumed)
    assert summary.steps == 3 and summary.last_checkpoint is not None
    model_dir = saved_model(run, 3)
    assert json.loads((model_dir / "config.json").read_text())["type"] == resumed.policy.type
    saved = json.loads((model_dir / "train_config.json").read_text())  # written before presets: its own
    assert saved["use_policy_training_preset"] is False
    assert (saved["optimizer"]["lr"], saved["scheduler"]) == (
        0.002,
        {"type": "cosine", "warmup_steps": 20, "min_lr_ratio": 0.1},
    )
