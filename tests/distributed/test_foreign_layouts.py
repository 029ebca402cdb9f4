"""DCP checkpoints in other tools' layouts, written for real on 2 gloo ranks under FSDP2: every
command and loader takes their model tensors only, never the optimizer state saved beside them, and
a directory whose model tensors cannot be told apart is refused with one line.

torchtitan's CheckpointManager saves `{**model_state_dict, "optimizer": optim_state_dict}` (model
tensors at the top level beside a nested optimizer entry); `scripts/foreign_dcp.py` rebuilds it with
`dcp.save`, with the optimizer nested and flattened.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import ckpt_tools
from ckpt_tools import layout
from ckpt_tools.catalog import TORCHTITAN_DCP, catalog
from ckpt_tools.reports.diff import diff_checkpoints
from helpers.launch import CKPT_CLI, run_torchrun

pytestmark = pytest.mark.distributed

SCRIPT = Path(__file__).parent / "scripts" / "foreign_dcp.py"
TITAN = ("titan", "titan_flat")


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("foreign_dcp")
    run_torchrun(SCRIPT, 2, str(out), timeout=180)
    return out


@pytest.fixture(scope="module")
def reference(written: Path) -> dict[str, torch.Tensor]:
    return load_file(written / "reference.safetensors")


def ckpt(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CKPT_CLI, *map(str, args)], capture_output=True, text=True, timeout=120)


def assert_bit_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name


@pytest.mark.parametrize("name", TITAN)
def test_torchtitan_layout_is_catalogued_with_both_roles(written: Path, name: str) -> None:
    cat = catalog(written / name)
    assert cat.layout == TORCHTITAN_DCP
    assert cat.labels == ("dcp", "optimizer dcp")
    assert ckpt_tools.open_checkpoint(written / name).formats == ("dcp",)


def test_torchtitan_convert_writes_model_tensors_only(written: Path, reference, tmp_path: Path) -> None:
    result = ckpt("convert", written / "titan", "--output", tmp_path / "cli")
    assert result.returncode == 0, result.stderr
    assert_bit_equal(load_file(tmp_path / "cli" / layout.MODEL_SAFETENSORS), reference)
    ckpt_tools.convert_dcp_to_safetensors(written / "titan_flat", tmp_path / "flat")
    assert_bit_equal(load_file(tmp_path / "flat" / layout.MODEL_SAFETENSORS), reference)


@pytest.mark.parametrize("name", TITAN)
def test_torchtitan_loads_inspects_verifies_and_diffs_as_the_model(
    written: Path, reference, name: str
) -> None:
    assert_bit_equal(ckpt_tools.load_model_state_dict(written / name), reference)
    described = ckpt_tools.describe_checkpoint(written / name).to_dict()
    assert described["layout"] == TORCHTITAN_DCP
    model = next(g for g in described["groups"] if g["role"] == "model")
    assert sorted(t["name"] for t in model["tensors"]) == sorted(reference)
    optimizer = next(g for g in described["groups"] if g["role"] == "optimizer")
    assert len(optimizer["tensors"]) > len(reference)  # exp_avg, exp_avg_sq and step per parameter
    assert all(t["name"].startswith("optimizer.") for t in optimizer["tensors"])
    report = ckpt_tools.verify_checkpoint(written / name)
    assert report.ok, report.problems
    diff = diff_checkpoints(written / name, written / "reference.safetensors")
    assert not diff.differs and not diff.only_a and not diff.only_b


def test_torchtitan_push_asks_for_a_conversion_first(written: Path, tmp_path: Path) -> None:
    result = ckpt("push", written / "titan", str(tmp_path / "published"))
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "run `ckpt convert" in result.stderr
    assert not (tmp_path / "published").exists()


def test_ambiguous_layout_is_refused_in_one_line(written: Path, tmp_path: Path) -> None:
    for command in (
        ("convert", written / "ambiguous", "--output", tmp_path / "out"),
        ("inspect", written / "ambiguous"),
    ):
        result = ckpt(*command)
        assert result.returncode == 1
        assert result.stderr.count("\n") == 1 and "ambiguous" in result.stderr
    assert not (tmp_path / "out").exists()
    with pytest.raises(ckpt_tools.CheckpointError, match="ambiguous"):
        ckpt_tools.load_model_state_dict(written / "ambiguous")
