"""--use_policy_training_preset: a LeRobot ACT command trains as lerobot-train does (AdamW at ACT's
optimizer_lr 1e-5, no schedule), the policy's fields change the preset, --optimizer.* / --scheduler.*
need the preset off, and a config written before presets resumes with the schedule it started with."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch

from helpers.fixtures import copy_fixture
from helpers.run_outputs import metrics, model_file
from helpers.train_flags import TINY_LEROBOT_ACT, tiny_args
from trainer.cli.parse import parse_config
from trainer.config.optim import CosineDecayWithWarmupConfig
from trainer.engine.plan import resolve_optimization, train
from trainer.errors import ConfigError


def _act_command(root: Path, out: Path, *extra: str) -> list[str]:
    """The seed's command (LeRobot's docs) on LeRobot's own image dataset, at test sizes."""
    return [
        "--dataset.repo_id=someone/my_dataset",
        f"--dataset.root={root}",
        "--policy.type=act",
        *TINY_LEROBOT_ACT,
        f"--output_dir={out}",
        "--steps=3",
        "--batch_size=4",
        "--save_freq=3",
        "--log_freq=1",
        "--num_workers=0",
        *extra,
    ]


def _lrs(out: Path) -> dict[int, float]:
    return {r["step"]: r["lr"] for r in metrics(out) if "lr" in r}


def _saved(out: Path, step: int) -> dict:
    return json.loads(model_file(out, step, "train_config.json").read_text())


@pytest.fixture
def images(tmp_path: Path) -> Path:
    return copy_fixture(tmp_path, "lerobot", "dataset_images")


def test_the_lerobot_act_command_trains_at_acts_preset_and_resumes_with_it(
    images, tmp_path, clean_accelerate, capsys
) -> None:
    out = tmp_path / "run"
    train(parse_config(_act_command(images, out)))
    assert _lrs(out) == {1: 1e-5, 2: 1e-5, 3: 1e-5}  # lerobot-train's ACT: constant 1e-5 from step 1
    assert "ACT's preset: AdamW lr 1e-05 (weight decay 0.0001, clip 10), constant" in capsys.readouterr().err
    saved = _saved(out, 3)
    assert saved["use_policy_training_preset"] is True
    assert saved["optimizer"] == {
        "type": "adamw", "lr": 1e-5, "weight_decay": 1e-4, "grad_clip_norm": 10.0, "betas": [0.9, 0.999],
        "eps": 1e-8,
    }  # fmt: skip
    assert saved["scheduler"] == {"type": "constant", "warmup_steps": 0, "min_lr_ratio": 0.1}

    resume = ["--resume=true", f"--output_dir={out}", "--steps=4", "--save_freq=4"]
    train(parse_config(resume))
    assert _lrs(out)[4] == 1e-5
    assert "the resumed run's train_config.json (ACT's preset): AdamW lr 1e-05" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"with --policy.optimizer_lr, ACT's preset is AdamW lr 0.0003"):
        resolve_optimization(parse_config([*resume, "--policy.optimizer_lr=3e-4"]))


def test_the_policys_own_fields_change_its_preset(images, tmp_path, clean_accelerate) -> None:
    out = tmp_path / "run"
    train(parse_config(_act_command(images, out, "--policy.optimizer_lr=3e-4", "--steps=2")))
    assert _lrs(out) == {1: 3e-4, 2: 3e-4}
    optimizer, _, _ = resolve_optimization(
        parse_config(["--policy.type=act", "--policy.optimizer_weight_decay=0"])
    )
    assert (optimizer.lr, optimizer.weight_decay) == (1e-5, 0.0)
    with pytest.raises(ConfigError, match=r"--policy.optimizer_lr must be > 0, got 0.0"):
        parse_config(["--policy.type=act", "--policy.optimizer_lr=0"])


@pytest.mark.parametrize(
    "flag", ["--optimizer.lr=1e-3", "--optimizer.type=sgd", "--scheduler.warmup_steps=0"]
)
def test_optimizer_flags_with_the_preset_on_are_one_line_refusals(flag) -> None:
    name = flag.partition("=")[0]
    with pytest.raises(
        ConfigError, match=re.escape(f"{name} is refused while --use_policy_training_preset=true")
    ) as error:
        resolve_optimization(parse_config(["--policy.type=act", flag]))
    assert "pass --use_policy_training_preset=false" in str(error.value) and "\n" not in str(error.value)


def test_without_the_preset_the_flags_train_as_before(tmp_path, dataset_cache, clean_accelerate) -> None:
    """The engine's defaults (AdamW 2e-3, cosine after a 20-step warmup) and its flag names, unchanged:
    the rates of the warmup's first steps, (k + 1) / 21 x 2e-3."""
    out = tmp_path / "run"
    flags = tiny_args(str(out), dataset_cache, "--policy.type=mlp", "--log_freq=1", "--steps=2")
    train(parse_config([*flags, "--use_policy_training_preset=false"]))
    assert _lrs(out) == pytest.approx({1: 2e-3 * 2 / 21, 2: 2e-3 * 3 / 21}, rel=1e-12)
    saved = _saved(out, 2)
    assert saved["optimizer"]["lr"] == 2e-3
    assert saved["scheduler"] == {"type": "cosine", "warmup_steps": 20, "min_lr_ratio": 0.1}


def test_a_config_written_before_presets_resumes_with_its_own_schedule(
    tmp_path, dataset_cache, clean_accelerate
) -> None:
    """4 steps straight through, and 2 + 2 resumed from a train_config.json without the
    use_policy_training_preset entry (as every file written before it): the same rates after the resume
    (the cosine spans --steps, so the 2-step start differs)."""
    ours = ["--policy.type=mlp", "--use_policy_training_preset=false", "--optimizer.lr=1e-3"]
    ours += ["--scheduler.warmup_steps=1", "--log_freq=1"]
    straight = tmp_path / "straight"
    train(parse_config(tiny_args(str(straight), dataset_cache, *ours)))
    split = tmp_path / "split"
    train(parse_config(tiny_args(str(split), dataset_cache, *ours, "--steps=2")))
    saved_path = model_file(split, 2, "train_config.json")
    old = {k: v for k, v in json.loads(saved_path.read_text()).items() if k != "use_policy_training_preset"}
    saved_path.write_text(json.dumps(old))
    resumed = parse_config(["--resume=true", f"--output_dir={split}", "--steps=4"])
    assert resumed.use_policy_training_preset is False
    train(resumed)
    after = {step: lr for step, lr in _lrs(split).items() if step > 2}
    assert after == {3: _lrs(straight)[3], 4: _lrs(straight)[4]} and after[4] == pytest.approx(1e-4)
    assert _saved(split, 4)["use_policy_training_preset"] is False


def test_lerobots_optimizer_types_build_their_torch_optimizers() -> None:
    params = [torch.nn.Parameter(torch.zeros(2))]
    for flags, kind in [
        (["--optimizer.type=sgd", "--optimizer.momentum=0.9"], torch.optim.SGD),
        (["--optimizer.type=adam"], torch.optim.Adam),
        ([], torch.optim.AdamW),
    ]:
        config = parse_config(["--use_policy_training_preset=false", *flags])
        optimizer, _, source = resolve_optimization(config)
        built = optimizer.build(params)
        assert type(built) is kind and source.startswith("--optimizer.* and --scheduler.*")
    assert built.defaults["weight_decay"] == 1e-4 and config.optimizer.lr == 2e-3  # the engine's AdamW
    sgd = parse_config(["--use_policy_training_preset=false", "--optimizer.type=sgd"]).optimizer
    assert (sgd.lr, sgd.weight_decay, sgd.grad_clip_norm) == (1e-3, 0.0, 10.0)  # LeRobot's SGDConfig


def test_cosine_decay_with_warmup_is_lerobots_schedule() -> None:
    """LeRobot's factors, worked by hand: warmup (k + 1) / (w + 1); then 0.1 + 0.9 x (1 + cos(pi k / 10)) / 2
    with decay_lr / peak_lr = 0.1 over 10 decay steps counted from step 0; a 5-step run compresses both
    (warmup int(2 x 5 / 10) = 1, decay over 5)."""
    schedule = CosineDecayWithWarmupConfig(
        num_warmup_steps=2, num_decay_steps=10, peak_lr=1e-4, decay_lr=1e-5
    )
    assert [schedule.factor(k, 20) for k in (0, 1)] == pytest.approx([1 / 3, 2 / 3])
    cos_at_2 = 0.1 + 0.45 * (1 + math.cos(math.pi * 0.2))
    assert [schedule.factor(k, 20) for k in (2, 10, 15)] == pytest.approx([cos_at_2, 0.1, 0.1])
    assert [schedule.factor(k, 5) for k in (0, 1, 5)] == pytest.approx([1 / 2, cos_at_2, 0.1])
    config = parse_config(
        [
            "--use_policy_training_preset=false",
            "--scheduler.type=cosine_decay_with_warmup",
            "--scheduler.num_warmup_steps=2",
        ]
    )
    assert config.scheduler == CosineDecayWithWarmupConfig(num_warmup_steps=2)
