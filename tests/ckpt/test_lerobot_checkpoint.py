"""A checkpoint written by `lerobot-train` itself (lerobot 0.6.1, the shared fixture as shipped) is
first-class: every command reads it as "LeRobot layout" with its step, num_processes (as dp_world_size) and batch_size,
its processor state files are found by the JSON step's `state_file`, verified and loaded, and only a
resume is refused, with one line. "Older release" stays for our own pre-v1 files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from report_fixtures import run_ckpt, write_step_dir
from safetensors.torch import load_file

import ckpt_tools
from ckpt_tools import layout
from ckpt_tools.catalog import LEROBOT, catalog
from ckpt_tools.errors import ForeignCheckpointError, LegacyCheckpointError
from helpers.fixtures import copy_fixture
from helpers.run_outputs import saved_model

PREPROCESSOR_STATE = "policy_preprocessor_step_3_normalizer_processor.safetensors"
LINE = "LeRobot layout (step 2, dp_world_size 1, batch_size 2)"  # 0.6.1's num_processes, read as LeRobot reads it


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private copy of the fixture's output directory (checkpoints at steps 2 and 4)."""
    return copy_fixture(tmp_path_factory.mktemp("lerobot"), "lerobot", "checkpoint_act")


@pytest.fixture
def step2(run_dir: Path, tmp_path: Path) -> Path:
    """Step 2 on its own, for a test that changes it."""
    return Path(shutil.copytree(run_dir / "checkpoints" / "000002", tmp_path / "000002"))


def test_catalog_and_inspect_show_the_lerobot_layout(run_dir: Path) -> None:
    cat = catalog(saved_model(run_dir, 2))
    assert cat.layout == LEROBOT and cat.layout_line() == LINE
    assert cat.labels == ("safetensors", "optimizer safetensors")
    for path in (
        run_dir,
        run_dir / "checkpoints" / "000002",
        saved_model(run_dir, 2),
    ):
        result = run_ckpt("inspect", path, "--json")
        assert result.exit_code == 0, result.stderr
        described = json.loads(result.stdout)
        assert described["layout"] == LEROBOT and described["training_step"] is None
    assert described["lerobot"] == {
        "step": 2,
        "dp_world_size": 1,
        "batch_size": 2,
        "grad_accum_steps": 1,
        "parallelism": None,
    }
    human = run_ckpt("inspect", run_dir / "checkpoints" / "000002")
    assert LINE in human.stdout and "older release" not in human.stdout + human.stderr


def test_verify_passes_and_checks_the_named_processor_files(run_dir: Path) -> None:
    report = ckpt_tools.verify_checkpoint(run_dir / "checkpoints" / "last")
    assert report.ok, report.problems
    assert PREPROCESSOR_STATE in report.checked and layout.OPTIMIZER_SAFETENSORS in report.checked
    result = run_ckpt("verify", run_dir / "checkpoints" / "000002")
    assert result.exit_code == 0 and LINE in result.stdout


def test_a_truncated_processor_state_file_fails_verify(step2: Path) -> None:
    path = step2 / layout.PRETRAINED_MODEL_DIR / PREPROCESSOR_STATE
    path.write_bytes(path.read_bytes()[:-10])
    report = ckpt_tools.verify_checkpoint(step2)
    assert not report.ok and len(report.problems) == 1 and PREPROCESSOR_STATE in report.problems[0]
    path.unlink()
    (missing,) = ckpt_tools.verify_checkpoint(step2).problems
    assert PREPROCESSOR_STATE in missing and "is missing" in missing


def test_processors_load_by_state_file(run_dir: Path) -> None:
    model_dir = run_dir / "checkpoints" / "000002" / layout.PRETRAINED_MODEL_DIR
    processors = ckpt_tools.load_processors(model_dir)
    pre = processors[layout.PREPROCESSOR]
    assert len(pre.step_tensors) == len(pre.config["steps"]) == 4
    assert pre.step_tensors[:3] == [{}, {}, {}]
    want = load_file(model_dir / PREPROCESSOR_STATE)
    assert sorted(pre.step_tensors[3]) == sorted(want)
    assert all(torch.equal(pre.step_tensors[3][k], v) for k, v in want.items())
    assert processors[layout.POSTPROCESSOR].step_tensors[0]  # the unnormalizer's statistics


def test_weights_load_diff_convert_and_push(run_dir: Path, tmp_path: Path) -> None:
    step = run_dir / "checkpoints" / "000002"
    want = load_file(step / layout.PRETRAINED_MODEL_DIR / layout.MODEL_SAFETENSORS)
    got = ckpt_tools.load_model_state_dict(step)
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], v) for k, v in want.items())
    assert ckpt_tools.open_checkpoint(step).layout == LEROBOT

    converted = run_ckpt("convert", step, "--to", "dcp", "--output", tmp_path / "dcp")
    assert converted.exit_code == 0, converted.stderr
    assert f"read {LINE}" in converted.stdout
    diff = run_ckpt("diff", step, tmp_path / "dcp")
    assert diff.exit_code == 0 and LINE in diff.stdout and "IDENTICAL" in diff.stdout

    pushed = run_ckpt("push", step, tmp_path / "published")
    assert pushed.exit_code == 0, pushed.stderr
    assert f"read {LINE}" in pushed.stdout
    files = sorted(p.name for p in (tmp_path / "published").iterdir())
    assert PREPROCESSOR_STATE in files and layout.OPTIMIZER_SAFETENSORS not in files
    card = (tmp_path / "published" / layout.MODEL_CARD).read_text()
    assert "trained with LeRobot" in card and "`trainer`" not in card
    assert "| Steps | 2 |" in card  # the step published, not the run's total of 4


def test_a_lerobot_checkpoint_is_a_merge_base(run_dir: Path, tmp_path: Path) -> None:
    base = run_dir / "checkpoints" / "000002"
    weights = load_file(base / layout.PRETRAINED_MODEL_DIR / layout.MODEL_SAFETENSORS)
    name = next(k for k, v in weights.items() if v.ndim == 2 and v.is_floating_point())
    adapter_dir = tmp_path / "adapter"
    adapter_dir.mkdir()
    rows, cols = weights[name].shape
    module = name.removesuffix(".weight")
    lora = {f"base_model.model.{module}.lora_A.weight": torch.ones(1, cols)}
    lora[f"base_model.model.{module}.lora_B.weight"] = torch.ones(rows, 1)
    from safetensors.torch import save_file

    save_file(lora, adapter_dir / layout.ADAPTER_SAFETENSORS)
    (adapter_dir / layout.ADAPTER_CONFIG).write_text(
        json.dumps({"peft_type": "LORA", "r": 1, "lora_alpha": 1})
    )
    result = run_ckpt("merge-adapter", adapter_dir, "--base", base, "--output", tmp_path / "merged")
    assert result.exit_code == 0, result.stderr
    assert f"base: {LINE}" in result.stdout
    merged = load_file(tmp_path / "merged" / layout.MODEL_SAFETENSORS)
    assert torch.equal(merged[name], weights[name] + 1)


def test_resume_is_refused_in_one_line(run_dir: Path) -> None:
    with pytest.raises(ForeignCheckpointError) as caught:
        ckpt_tools.read_training_step(run_dir)
    message = str(caught.value)
    assert "\n" not in message and "LeRobot" in message and "older release" not in message


def test_older_release_is_kept_for_our_own_pre_v1_files(tmp_path: Path) -> None:
    step_dir = write_step_dir(tmp_path, "safetensors")
    path = step_dir / layout.TRAINING_STATE_DIR / layout.TRAINING_STEP
    data = json.loads(path.read_text())
    data.pop("format_version")
    path.write_text(json.dumps(data))
    with pytest.raises(LegacyCheckpointError, match="older release"):
        ckpt_tools.read_training_step(step_dir)
