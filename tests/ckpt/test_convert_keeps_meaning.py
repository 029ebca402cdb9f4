"""Converting never changes what a checkpoint means: a `--dtype` cast is a copy outside the weights
loaders and resume read, `--delete-dcp` leaves a step whose metadata names what it holds, and the
full-precision master wins over a narrower copy found beside it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from report_fixtures import run_ckpt, tiny_model_state, write_step_dir
from safetensors.torch import load_file, save_file

import ckpt_tools
from ckpt_tools import layout
from ckpt_tools.catalog import catalog, weights_for_loading, weights_for_resume


@pytest.fixture
def step_dir(tmp_path: Path) -> Path:
    return write_step_dir(tmp_path, "dcp", dp_shard=2)


def fp32_master_loads(step_dir: Path) -> None:
    state = tiny_model_state()
    loaded = ckpt_tools.load_model_state_dict(step_dir)
    assert all(loaded[k].dtype == v.dtype and torch.equal(loaded[k], v) for k, v in state.items())


def test_a_cast_goes_to_an_export_directory_and_the_step_stays_as_it_was(step_dir: Path) -> None:
    result = run_ckpt("convert", step_dir, "--dtype", "bf16")
    assert result.exit_code == 0, result.stderr
    export = step_dir / "export-bf16" / layout.MODEL_SAFETENSORS
    assert {t.dtype for k, t in load_file(export).items() if k != "head.count"} == {torch.bfloat16}
    assert not (step_dir / layout.PRETRAINED_MODEL_DIR / layout.MODEL_SAFETENSORS).exists()
    assert ckpt_tools.verify_checkpoint(step_dir).ok
    fp32_master_loads(step_dir)


@pytest.mark.parametrize("into", ["pretrained_model", "."])
def test_a_cast_into_the_step_is_refused_in_one_line(step_dir: Path, into: str) -> None:
    before = sorted(p.name for p in (step_dir / layout.PRETRAINED_MODEL_DIR).iterdir())
    result = run_ckpt("convert", step_dir, "--dtype", "bf16", "--output", step_dir / into)
    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1 and "lower-precision copy" in result.stderr
    assert sorted(p.name for p in (step_dir / layout.PRETRAINED_MODEL_DIR).iterdir()) == before
    assert not (step_dir / layout.MODEL_SAFETENSORS).exists()


def test_a_cast_may_not_delete_its_full_precision_source(step_dir: Path) -> None:
    result = run_ckpt("convert", step_dir, "--dtype", "bf16", "--delete-dcp")
    assert result.exit_code == 1 and result.stderr.count("\n") == 1 and "--delete-dcp" in result.stderr
    assert (step_dir / layout.PRETRAINED_MODEL_DIR / layout.MODEL_DCP_DIR / layout.DCP_METADATA).exists()


def test_the_full_precision_master_wins_over_a_narrower_copy_beside_it(step_dir: Path) -> None:
    """A step an older release damaged: a bf16 model.safetensors beside the fp32 shards."""
    model_dir = step_dir / layout.PRETRAINED_MODEL_DIR
    save_file(
        {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in tiny_model_state().items()},
        model_dir / layout.MODEL_SAFETENSORS,
    )
    cat = catalog(step_dir)
    assert weights_for_loading(cat).format == "dcp"  # type: ignore[union-attr]
    assert weights_for_resume(cat, sharded=False).format == "dcp"  # type: ignore[union-attr]
    assert weights_for_resume(cat, sharded=True).format == "dcp"  # type: ignore[union-attr]
    fp32_master_loads(step_dir)


def test_delete_dcp_leaves_a_step_that_names_its_format_and_verifies(step_dir: Path) -> None:
    result = run_ckpt("convert", step_dir, "--delete-dcp")
    assert result.exit_code == 0, result.stderr
    assert not (step_dir / layout.PRETRAINED_MODEL_DIR / layout.MODEL_DCP_DIR).exists()
    saved = json.loads((step_dir / layout.TRAINING_STATE_DIR / layout.TRAINING_STEP).read_text())
    assert saved["checkpoint_format"] == "safetensors"
    report = ckpt_tools.verify_checkpoint(step_dir)
    assert report.ok, report.problems
    fp32_master_loads(step_dir)


@pytest.mark.parametrize("publish", [(), ("--push-to-hub", "published")])
def test_delete_dcp_into_another_directory_is_refused(step_dir: Path, tmp_path: Path, publish) -> None:  # type: ignore[no-untyped-def]
    publish = tuple(str(tmp_path / p) if p == "published" else p for p in publish)
    result = run_ckpt("convert", step_dir, "--delete-dcp", "--output", tmp_path / "elsewhere", *publish)
    assert result.exit_code == 1 and "without weights" in result.stderr
    assert (step_dir / layout.PRETRAINED_MODEL_DIR / layout.MODEL_DCP_DIR).exists()
    assert not (tmp_path / "elsewhere").exists() and not (tmp_path / "published").exists()


def test_merge_adapter_takes_a_safetensors_file_as_base(tmp_path: Path) -> None:
    base = tiny_model_state()
    save_file(base, tmp_path / "base.safetensors")
    adapter_dir = tmp_path / "adapter"
    adapter_dir.mkdir()
    rows, cols = base["encoder.weight"].shape
    lora = {
        "base_model.model.encoder.lora_A.weight": torch.ones(1, cols),
        "base_model.model.encoder.lora_B.weight": torch.ones(rows, 1),
    }
    save_file(lora, adapter_dir / layout.ADAPTER_SAFETENSORS)
    (adapter_dir / layout.ADAPTER_CONFIG).write_text(
        json.dumps({"peft_type": "LORA", "r": 1, "lora_alpha": 2})
    )
    out = tmp_path / "merged"
    result = run_ckpt("merge-adapter", adapter_dir, "--base", tmp_path / "base.safetensors", "--output", out)
    assert result.exit_code == 0, result.stderr
    merged = load_file(out / layout.MODEL_SAFETENSORS)
    assert torch.equal(merged["encoder.weight"], base["encoder.weight"] + 2)
