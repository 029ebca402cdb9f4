"""Gradient accumulation and checkpoints: every save ends an accumulation window, so a resume is exact.

A checkpoint holds no accumulated gradients. A save inside a window would resume without the window's
earlier micro-batches, so such a `--save_freq` (or `--steps`) is refused at start; windows are counted
from step 0, also on a resumed run, so the saves of a run resumed with another accumulation still end
windows.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ckpt_tools import layout
from helpers.train_flags import tiny_args
from trainer.cli.parse import parse_config
from trainer.engine.plan import train
from trainer.errors import ConfigError

ACCUM = "--accelerator.gradient_accumulation.steps"


def _run(out: Path, cache: str, *extra: str) -> None:
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    train(parse_config(tiny_args(str(out), cache, "--policy.type=mlp", "--policy.hidden_dim=16", *extra)))


def _resume_from(step_dir: Path, out: Path, cache: str, *extra: str) -> None:
    config = step_dir / layout.PRETRAINED_MODEL_DIR / layout.TRAIN_CONFIG
    _run(out, cache, "--resume=true", "--config_path", str(config), *extra)


def _state(step_dir: Path) -> dict[str, torch.Tensor]:
    """Weights and optimizer state of a non-sharded checkpoint, as stored."""
    model = load_file(step_dir / layout.PRETRAINED_MODEL_DIR / layout.MODEL_SAFETENSORS)
    optimizer = load_file(step_dir / layout.TRAINING_STATE_DIR / layout.OPTIMIZER_SAFETENSORS)
    return {**{f"model.{k}": v for k, v in model.items()}, **{f"optim.{k}": v for k, v in optimizer.items()}}


def _assert_bit_identical(a: Path, b: Path) -> None:
    got, want = _state(a), _state(b)
    assert got.keys() == want.keys()
    for key, tensor in want.items():
        assert torch.equal(got[key], tensor), key


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            [f"{ACCUM}=2", "--save_freq=3", "--steps=6"],
            f"--save_freq=3 is not a multiple of {ACCUM}=2: a checkpoint inside an accumulation window "
            "cannot resume exactly; use --save_freq=4 (or --save_freq=2)",
        ),
        (
            [f"{ACCUM}=4", "--save_freq=2", "--steps=8"],
            f"--save_freq=2 is not a multiple of {ACCUM}=4: a checkpoint inside an accumulation window "
            "cannot resume exactly; use --save_freq=4",
        ),
        (
            [f"{ACCUM}=2", "--save_freq=2", "--steps=5"],
            f"--steps=5 is not a multiple of {ACCUM}=2: the last micro-batches would never update the "
            "weights and the final checkpoint would sit inside a window; use --steps=6 (or --steps=4)",
        ),
    ],
)
def test_a_save_inside_an_accumulation_window_is_refused_at_start(flags: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(flags)
    assert str(refused.value) == message


def test_saves_that_end_windows_are_accepted() -> None:
    parse_config([f"{ACCUM}=2", "--save_freq=4", "--steps=6"])
    parse_config([f"{ACCUM}=3", "--save_freq=10", "--steps=9"])  # only the final save, at a window end


@pytest.mark.numerics
def test_resume_at_a_window_end_is_bit_exact(tmp_path: Path, dataset_cache: str, clean_accelerate) -> None:
    """Uninterrupted 6 steps (3 updates of 2 micro-batches) against a resume from step 4."""
    flags = (f"{ACCUM}=2", "--steps=6", "--save_freq=2")
    _run(tmp_path / "whole", dataset_cache, *flags)
    whole = tmp_path / "whole" / "checkpoints"
    _resume_from(whole / "000004", tmp_path / "resumed", dataset_cache, *flags)
    _assert_bit_identical(tmp_path / "resumed" / "checkpoints" / "000006", whole / "000006")


@pytest.mark.numerics
def test_windows_count_from_step_zero_on_a_run_resumed_with_accumulation(
    tmp_path: Path, dataset_cache: str, clean_accelerate
) -> None:
    """Saved at step 3 without accumulation, resumed with 2: the windows end at steps 4 and 6 (not 5),
    so the step-4 checkpoint of that run resumes to the same step 6."""
    _run(tmp_path / "first", dataset_cache, "--steps=3", "--save_freq=3")
    flags = (f"{ACCUM}=2", "--steps=6", "--save_freq=2")
    _resume_from(tmp_path / "first" / "checkpoints" / "000003", tmp_path / "second", dataset_cache, *flags)
    second = tmp_path / "second" / "checkpoints"
    _resume_from(second / "000004", tmp_path / "third", dataset_cache, *flags)
    _assert_bit_identical(tmp_path / "third" / "checkpoints" / "000006", second / "000006")
