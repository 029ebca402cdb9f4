"""`ckpt diff`: names only on one side, shape and dtype changes, and exact value differences."""

from __future__ import annotations

import json
import math
from pathlib import Path

import fsspec
import pytest
import torch
from report_fixtures import fsdp_checkpoint, run_ckpt, tiny_model_state, write_step_dir
from safetensors.torch import save, save_file

from ckpt_tools import layout
from ckpt_tools.reports import diff as diff_module
from ckpt_tools.reports.diff import (
    DIFFERENT,
    DTYPE_CHANGED,
    EQUAL,
    SHAPE_CHANGED,
    diff_checkpoints,
    value_difference,
)


@pytest.fixture(scope="module")
def fsdp_step(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fsdp_checkpoint(tmp_path_factory)


def changed_state() -> dict[str, torch.Tensor]:
    state = tiny_model_state()
    state["encoder.weight"] = state["encoder.weight"].clone()
    state["encoder.weight"][2, 3] += 0.25
    state["head.weight"] = state["head.weight"].float()
    state["encoder.bias"] = state["encoder.bias"][:5].clone()
    del state["head.count"]
    state["extra"] = torch.ones(2)
    return state


def test_gathered_safetensors_equal_the_uneven_dcp_shards(fsdp_step: Path) -> None:
    model_dir = fsdp_step / layout.PRETRAINED_MODEL_DIR
    report = diff_checkpoints(model_dir / layout.MODEL_SAFETENSORS, model_dir / layout.MODEL_DCP_DIR)
    assert not report.differs
    assert [t.name for t in report.tensors] == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert all(t.status == EQUAL and t.max_abs == 0.0 for t in report.tensors)


def test_every_kind_of_change(tmp_path: Path) -> None:
    a = write_step_dir(tmp_path, "dcp", dp_shard=2)  # values read from DCP shards
    b = tmp_path / "b.safetensors"
    new = changed_state()
    save_file(new, str(b))
    report = diff_checkpoints(a, b)
    assert report.differs
    assert report.only_a == ("head.count",) and report.only_b == ("extra",)
    by_name = {t.name: t for t in report.tensors}
    assert by_name["encoder.bias"].status == SHAPE_CHANGED and by_name["encoder.bias"].max_abs is None
    assert (by_name["encoder.bias"].shape_a, by_name["encoder.bias"].shape_b) == ((7,), (5,))
    head = by_name["head.weight"]
    assert (head.status, head.dtype_a, head.dtype_b, head.max_abs) == (DTYPE_CHANGED, "BF16", "F32", 0.0)
    weight = by_name["encoder.weight"]
    old = tiny_model_state()["encoder.weight"][2, 3].double()
    changed = new["encoder.weight"][2, 3].double()
    assert weight.status == DIFFERENT
    assert weight.max_abs == float((changed - old).abs())
    assert weight.max_rel == pytest.approx(float((changed - old).abs() / max(abs(old), abs(changed))))


def test_atol_makes_small_differences_equal(tmp_path: Path) -> None:
    state = tiny_model_state()
    save_file(state, str(tmp_path / "a.safetensors"))
    state["encoder.bias"] = state["encoder.bias"] + 1e-3
    save_file(state, str(tmp_path / "b.safetensors"))
    strict = diff_checkpoints(tmp_path / "a.safetensors", tmp_path / "b.safetensors")
    loose = diff_checkpoints(tmp_path / "a.safetensors", tmp_path / "b.safetensors", atol=1e-2)
    assert strict.differs and not loose.differs
    assert loose.num_equal == 4


def test_value_difference_handles_nan_inf_and_zero() -> None:
    a = torch.tensor([0.0, math.nan, math.inf, 1.0, 0.0])
    assert value_difference(a, a.clone()) == (0.0, 0.0)
    b = torch.tensor([0.0, 1.0, math.inf, 1.0, 0.0])
    assert value_difference(a, b) == (math.inf, math.inf)
    assert value_difference(torch.tensor([2.0, -1.0]), torch.tensor([1.0, 1.0])) == (2.0, 2.0)
    assert value_difference(torch.tensor([True, False]), torch.tensor([True, True])) == (1.0, 1.0)


def test_value_difference_is_the_same_slice_by_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(1)
    a, b = torch.randn(37, 11, generator=gen), torch.randn(37, 11, generator=gen)
    whole = value_difference(a, b)
    monkeypatch.setattr(diff_module, "_SLICE", 10)
    assert value_difference(a, b) == whole
    assert whole[0] == float((a.double() - b.double()).abs().max())


def test_loads_one_tensor_at_a_time(tmp_path: Path) -> None:
    save_file(tiny_model_state(0), str(tmp_path / "a.safetensors"))
    save_file(tiny_model_state(1), str(tmp_path / "b.safetensors"))
    seen: list[str] = []
    report = diff_checkpoints(tmp_path / "a.safetensors", tmp_path / "b.safetensors", on_tensor=seen.append)
    assert seen == sorted(tiny_model_state())
    assert {t.name: t.status for t in report.tensors} == {
        "encoder.bias": DIFFERENT,
        "encoder.weight": DIFFERENT,
        "head.count": EQUAL,
        "head.weight": DIFFERENT,
    }


def test_reads_safetensors_on_an_fsspec_store(tmp_path: Path) -> None:
    fs = fsspec.filesystem("memory")
    fs.pipe_file("/diff/a.safetensors", save(tiny_model_state(0)))
    fs.pipe_file("/diff/b.safetensors", save(changed_state()))
    report = diff_checkpoints("memory://diff/a.safetensors", "memory://diff/b.safetensors")
    assert report.only_b == ("extra",)
    assert {t.name: t.status for t in report.tensors}["encoder.weight"] == DIFFERENT


def test_cli_exit_codes_and_json(tmp_path: Path) -> None:
    save_file(tiny_model_state(), str(tmp_path / "a.safetensors"))
    save_file(changed_state(), str(tmp_path / "b.safetensors"))
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    result = run_ckpt("diff", a, b)
    assert result.exit_code == 0
    assert "DIFFERENT" in result.stdout and "only in a (1): head.count" in result.stdout
    assert "encoder.weight" in result.stdout and "shape changed" in result.stdout
    assert run_ckpt("diff", a, b, "--exit-code").exit_code == 1
    same = run_ckpt("diff", a, a, "--exit-code")
    assert same.exit_code == 0 and "IDENTICAL: 4 of 4" in same.stdout
    data = json.loads(run_ckpt("diff", a, b, "--json").stdout)
    assert data["differs"] is True and data["only_b"] == ["extra"]
    assert {t["name"]: t["status"] for t in data["tensors"]}["head.weight"] == DTYPE_CHANGED
    assert run_ckpt("diff", a, b, "--atol", "-1").exit_code == 2  # typer refuses a negative tolerance


def test_piped_output_never_truncates_names(tmp_path: Path) -> None:
    """Scripts grep the piped table: a name longer than any terminal stays whole on its row."""
    name = "base_model.model.encoder.layers.0.self_attention.in_projection.lora_B.default.weight" * 2
    save_file({name: torch.zeros(3, 4)}, str(tmp_path / "a.safetensors"))
    save_file({name: torch.ones(3, 4)}, str(tmp_path / "b.safetensors"))
    result = run_ckpt("diff", tmp_path / "a.safetensors", tmp_path / "b.safetensors")
    assert result.exit_code == 0
    row = next(line for line in result.stdout.splitlines() if "different" in line)
    assert name in row and "…" not in result.stdout
