"""Weight sets are declared once (`format/weight_sets.py`): every reader and writer that takes
`weights=` answers a name that is no weight set, and a set a step lacks, with the same line, and a set
added to the table is listed, chosen and loaded without another change."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import ckpt_tools
from ckpt_tools import layout
from ckpt_tools.catalog import catalog
from ckpt_tools.errors import NotACheckpointError, UsageError
from ckpt_tools.format import weight_sets
from ckpt_tools.format.weight_sets import WeightSetKind
from helpers.tiny_run import make_run, save, training_step

# every reader and writer that takes `weights=`, on one step directory
READERS = {
    "load_model_state_dict": lambda step, weights: ckpt_tools.load_model_state_dict(step, weights=weights),
    "choose_weights": lambda step, weights: ckpt_tools.open_checkpoint(step).choose_weights(weights),
    "publish_model": lambda step, weights: ckpt_tools.publish_model(
        step, f"{step}-published", weights=weights
    ),
    "convert_dcp_to_safetensors": lambda step, weights: ckpt_tools.convert_dcp_to_safetensors(
        step, weights=weights
    ),
}


@pytest.fixture
def step_without_ema(tmp_path: Path) -> str:
    model, optimizer, scheduler = make_run()
    ts = training_step(1, checkpoint_format="safetensors_dcp")
    return save(tmp_path / "checkpoints", 1, model, optimizer, scheduler, ts=ts)


@pytest.mark.parametrize("reader", sorted(READERS))
def test_one_line_for_a_name_that_is_no_weight_set(step_without_ema: str, reader: str) -> None:
    with pytest.raises(UsageError, match=r"^weights='best' is not one of model, ema$") as caught:
        READERS[reader](step_without_ema, "best")
    assert caught.value.option == "--weights"


@pytest.mark.parametrize("reader", sorted(READERS))
def test_one_line_for_a_set_the_step_lacks(step_without_ema: str, reader: str) -> None:
    with pytest.raises(NotACheckpointError) as caught:
        READERS[reader](step_without_ema, "ema")
    assert str(caught.value).split(" holds ", 1)[1] == (
        "no EMA weights (ema.safetensors or ema_dcp/): it was saved without --ema.enable; use its model weights"
    )


STUDENT = WeightSetKind(
    "student", "student", "student.safetensors", None, "student_dcp", "model", True, "--distill.enable"
)


def test_a_set_added_to_the_table_is_listed_chosen_and_loaded(
    step_without_ema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A distilled student saved beside the model, overlaying some of its tensors: one table entry
    (and its producer, here a file written by hand) is all the readers need."""
    monkeypatch.setattr(weight_sets, "WEIGHT_SETS", (*weight_sets.WEIGHT_SETS, STUDENT))
    model_dir = Path(step_without_ema) / layout.PRETRAINED_MODEL_DIR
    student = {"0.weight": torch.full((7, 4), 0.5)}
    save_file(student, model_dir / "student.safetensors")

    assert "student safetensors" in catalog(step_without_ema).labels
    checkpoint = ckpt_tools.open_checkpoint(step_without_ema)
    assert checkpoint.weight_sets == ("model", "student") and checkpoint.default_weights == "student"
    model = ckpt_tools.load_model_state_dict(step_without_ema)
    loaded = ckpt_tools.load_model_state_dict(step_without_ema, weights="student")
    assert torch.equal(loaded["0.weight"], student["0.weight"])
    assert loaded.keys() == model.keys() and torch.equal(loaded["2.weight"], model["2.weight"])


def test_a_set_added_to_the_table_is_saved_and_resumed_through_the_same_mapping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writing goes through the table too: the save takes the student by its name beside the EMA, in
    both formats, and a resume fills each set in place and names the sets it filled."""
    monkeypatch.setattr(weight_sets, "WEIGHT_SETS", (*weight_sets.WEIGHT_SETS, STUDENT))
    model, optimizer, scheduler = make_run()
    student = {name: torch.full_like(p, 0.25) for name, p in model.named_parameters()}
    ema = {name: p.detach() + 1 for name, p in model.named_parameters()}
    ts = training_step(1, checkpoint_format="safetensors_dcp")
    step = save(
        tmp_path / "c", 1, model, optimizer, scheduler, ts=ts, extra_weights={"ema": ema, "student": student}
    )
    model_dir = Path(step) / layout.PRETRAINED_MODEL_DIR
    assert (model_dir / "student.safetensors").is_file() and (model_dir / "student_dcp").is_dir()
    filled = {name: torch.zeros_like(value) for name, value in student.items()}
    loaded = ckpt_tools.training.load_training_state(step, model=model, extra_weights={"student": filled})
    assert loaded == {"student"}
    assert all(torch.equal(filled[name], student[name]) for name in student)


def test_a_save_refuses_a_name_that_is_no_set_beside_the_model(tmp_path: Path) -> None:
    model, optimizer, scheduler = make_run()
    with pytest.raises(
        UsageError, match=r"^extra_weights names 'adapter', which is not a weight set saved beside"
    ):
        save(tmp_path / "c", 1, model, optimizer, scheduler, extra_weights={"adapter": {}})
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").iterdir())  # nothing written
