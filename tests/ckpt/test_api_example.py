"""The evaluation-pipeline example at the top of the API reference (`ckpt_tools`' docstring) runs as
written against a run's `checkpoints/last`, and computes what the saved EMA weights compute."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn

import ckpt_tools
from helpers.tiny_run import training_step

CONFIG = {"obs_dim": 3, "hidden": 5, "action_dim": 2}


def _example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", ckpt_tools.__doc__ or "", flags=re.DOTALL)
    assert len(blocks) == 1, "the package docstring holds one example"
    return blocks[0]


def _saved_run(root: Path) -> dict[str, torch.Tensor]:
    """A run's checkpoint with an EMA, where the example looks (`outputs/run/checkpoints`); returns
    the EMA shadow it saved."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(CONFIG["obs_dim"], CONFIG["hidden"]),
        nn.ReLU(),
        nn.Linear(CONFIG["hidden"], CONFIG["action_dim"]),
    )
    ema = {name: param.detach() * 0.5 + 0.25 for name, param in model.named_parameters()}
    ckpt_tools.training.save_checkpoint(
        ckpt_tools.training.SaveRequest(
            checkpoints_dir=root / "outputs" / "run" / "checkpoints",
            training_step=training_step(3),
            model=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            policy_config=CONFIG,
            train_config={"steps": 3},
            extra_weights={"ema": ema},
        )
    )
    return ema


def test_the_example_loads_the_ema_and_runs_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ema = _saved_run(tmp_path)
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    exec(compile(_example(), "ckpt_tools example", "exec"), namespace)
    # what the EMA weights give for a zero observation: the bias path through the two layers
    hidden = torch.relu(ema["0.bias"])
    expected = ema["2.weight"] @ hidden + ema["2.bias"]
    assert namespace["weights"] == "ema"
    action = namespace["action"]
    assert isinstance(action, torch.Tensor) and torch.allclose(action[0], expected)
