"""`--ema.*` in one process: LeRobot's decay schedule, the shadow's update and its swap for evaluation."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trainer.config.ema import EmaConfig
from trainer.engine.ema import Ema
from trainer.errors import ConfigError


def test_decay_follows_the_warmup_schedule() -> None:
    config = EmaConfig(update_after_step=2, inv_gamma=1.0, power=2 / 3, max_decay=0.9999)
    assert [config.decay_at(n) for n in (1, 2, 3)] == [0.0, 0.0, 0.0]  # k = n - 2 - 1 <= 0: a copy
    assert config.decay_at(4) == pytest.approx(1 - 2 ** (-2 / 3))  # k = 1
    assert config.decay_at(13) == pytest.approx(1 - 11 ** (-2 / 3))  # k = 10
    assert config.decay_at(10**9) == 0.9999  # capped by max_decay (= decay)


def test_decay_bounds_and_no_warmup() -> None:
    assert EmaConfig(decay=0.9, power=0).decay_at(2) == 0.9  # power 0: the decay at once
    assert EmaConfig(decay=0.5).decay_at(10**6) == 0.5  # decay caps the warmed-up value
    assert EmaConfig(min_decay=0.5).decay_at(2) == 0.5  # 1 - 2**(-2/3) ~ 0.37, raised to min_decay


@pytest.mark.parametrize(
    ("changes", "flag"),
    [
        ({"decay": 1.0}, "--ema.decay must be in (0, 1), got 1.0"),
        ({"decay": 0.0}, "--ema.decay must be in (0, 1), got 0.0"),
        ({"update_after_step": -1}, "--ema.update_after_step"),
        ({"inv_gamma": 0.0}, "--ema.inv_gamma"),
        ({"power": -1.0}, "--ema.power"),
        ({"min_decay": 0.5, "max_decay": 0.4}, "--ema.min_decay and --ema.max_decay"),
    ],
)
def test_bad_values_are_one_line(changes: dict, flag: str) -> None:
    with pytest.raises(ConfigError) as caught:
        EmaConfig(**changes)
    assert flag in str(caught.value) and "\n" not in str(caught.value)


def model() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    net[0].bias.requires_grad_(False)  # frozen: not averaged (a PEFT base is frozen the same way)
    return net


def test_update_is_the_ema_of_the_trained_parameters_only() -> None:
    net, config = model(), EmaConfig(decay=0.5, power=0)
    ema = Ema(config, net)
    assert list(ema.shadow) == ["0.weight", "1.weight", "1.bias"]
    expected = {name: param.detach().clone() for name, param in net.named_parameters()}
    for n in (1, 2, 3):
        with torch.no_grad():
            for param in net.parameters():
                param.add_(torch.randn_like(param))
        decay = ema.update(n)
        assert decay == (0.0 if n == 1 else 0.5)
        for name, param in net.named_parameters():
            if param.requires_grad:
                expected[name] = torch.lerp(expected[name], param.detach(), 1 - decay)
    for name, value in ema.shadow.items():
        assert torch.equal(value, expected[name]), name
        assert not value.requires_grad


def test_swapped_in_evaluates_the_shadow_and_restores_the_weights() -> None:
    net = model()
    ema = Ema(EmaConfig(decay=0.5, power=0), net)
    with torch.no_grad():
        net[1].weight.add_(1.0)
    trained = {name: param.detach().clone() for name, param in net.named_parameters()}
    with ema.swapped_in():
        assert torch.equal(net[1].weight, ema.shadow["1.weight"])
    for name, param in net.named_parameters():
        assert torch.equal(param, trained[name]), name


def test_the_eval_line_names_the_ema_weights() -> None:
    from trainer.evaluation.rollouts import summary_line

    result = {"policy_return": -150.0, "random_return": -1200.0, "episodes": 2}
    assert summary_line({**result, "weights": "ema"}).endswith("over 2 episodes (EMA weights)")
    assert summary_line({**result, "weights": "model"}).endswith("over 2 episodes")
