"""The EMA weight set in one process: saved beside the model, listed, verified, loaded and resumed;
a step written without it still reads everywhere."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

import ckpt_tools
from ckpt_tools import layout
from ckpt_tools.catalog import catalog, weights_for_loading
from ckpt_tools.errors import NotACheckpointError, UsageError
from helpers.tiny_run import assert_same_tensors, make_run, save, train


def shadow_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A stand-in EMA: every parameter (not the integer buffer), visibly different from the weights."""
    return {name: param.detach() * 0.5 + 1 for name, param in model.named_parameters()}


@pytest.fixture
def saved(tmp_path):
    model, optimizer, scheduler = make_run()
    train(model, optimizer, scheduler, 2)
    ema = shadow_of(model)
    step = save(tmp_path / "checkpoints", 2, model, optimizer, scheduler, extra_weights={"ema": ema})
    return step, model, ema


def test_ema_is_a_weight_set_of_its_own(saved) -> None:
    step_dir, model, ema = saved
    assert sorted(ckpt_tools.describe_checkpoint(step_dir).formats) == [
        "ema safetensors",
        "optimizer safetensors",
        "safetensors",
    ]
    assert weights_for_loading(catalog(step_dir)).role == "model"  # what an old reader loads: the model
    report = ckpt_tools.verify_checkpoint(step_dir, deep=True)
    assert report.ok, report.problems
    assert any("ema safetensors averages safetensors" in line for line in report.checked)
    model_state = ckpt_tools.load_model_state_dict(step_dir)
    assert_same_tensors(model_state, {k: v.detach() for k, v in model.state_dict().items()})
    loaded = ckpt_tools.load_model_state_dict(step_dir, weights="ema")
    assert_same_tensors(loaded, {**model_state, **ema})  # the buffer comes from the model set


def test_resume_fills_the_shadow_in_place(saved) -> None:
    step, _, ema = saved
    model, optimizer, _ = make_run(seed=1)
    shadow = {name: torch.zeros_like(value) for name, value in ema.items()}
    before = {name: value.data_ptr() for name, value in shadow.items()}
    assert ckpt_tools.training.load_training_state(
        step, model=model, optimizer=optimizer, extra_weights={"ema": shadow}
    ) == {"ema"}
    assert_same_tensors(shadow, ema)
    assert {name: value.data_ptr() for name, value in shadow.items()} == before


def test_a_step_without_ema_still_reads(tmp_path) -> None:
    model, optimizer, scheduler = make_run()
    step = save(tmp_path / "checkpoints", 1, model, optimizer, scheduler)
    assert not ckpt_tools.open_checkpoint(step).has_ema
    shadow = shadow_of(model)
    kept = {name: value.clone() for name, value in shadow.items()}
    assert not ckpt_tools.training.load_training_state(
        step, model=model, optimizer=optimizer, extra_weights={"ema": shadow}
    )
    assert_same_tensors(shadow, kept)  # left as it was
    with pytest.raises(NotACheckpointError, match=r"holds no EMA weights .* saved without --ema\.enable"):
        ckpt_tools.load_model_state_dict(step, weights="ema")
    with pytest.raises(UsageError, match=r"weights='best' is not one of model, ema"):
        ckpt_tools.load_model_state_dict(step, weights="best")


def test_verify_refuses_an_ema_that_does_not_fit_the_weights(saved) -> None:
    step, _, ema = saved
    path = f"{step}/{layout.PRETRAINED_MODEL_DIR}/{layout.EMA_SAFETENSORS}"
    save_file({**ema, "0.weight": torch.zeros(2, 2)}, path)
    problems = ckpt_tools.verify_checkpoint(step).problems
    assert any(
        "'0.weight' is F32[2, 2] in ema safetensors but F32[7, 4] in safetensors" in p for p in problems
    )
    with pytest.raises(ckpt_tools.CorruptCheckpointError, match=r"has shape \[2, 2\] for 0\.weight"):
        model, _, _ = make_run()
        ckpt_tools.training.load_training_state(step, model=model, extra_weights={"ema": shadow_of(model)})


def test_publishing_takes_the_ema_when_present(saved, tmp_path) -> None:
    step, _, ema = saved
    model_state = ckpt_tools.load_model_state_dict(step)
    result = ckpt_tools.publish_model(step, str(tmp_path / "pub"))
    assert layout.EMA_SAFETENSORS not in result.files and layout.MODEL_SAFETENSORS in result.files
    assert any("EMA weights" in note for note in result.notes)
    assert_same_tensors(load_file(tmp_path / "pub" / layout.MODEL_SAFETENSORS), {**model_state, **ema})
    plain = ckpt_tools.publish_model(step, str(tmp_path / "plain"), weights="model")
    assert not plain.notes
    assert_same_tensors(load_file(tmp_path / "plain" / layout.MODEL_SAFETENSORS), model_state)
