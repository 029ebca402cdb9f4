"""`ckpt convert` on the command line: JSON result, exit codes and one-line errors for bad inputs."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from report_fixtures import run_ckpt
from safetensors.torch import load_file

from ckpt_tools import layout

TENSORS = {"w": torch.randn(6, 3), "b": torch.randn(3).to(torch.float16), "n": torch.arange(4)}


@pytest.fixture
def step_dir(tmp_path: Path) -> Path:
    """A step directory whose model is DCP only (checkpoint_format=dcp), written by one process."""
    model_dir = tmp_path / "000010" / layout.PRETRAINED_MODEL_DIR
    dcp.save(dict(TENSORS), checkpoint_id=str(model_dir / layout.MODEL_DCP_DIR), no_dist=True)
    return tmp_path / "000010"


def test_json_result_and_a_cast_in_the_export_directory(step_dir: Path) -> None:
    result = run_ckpt("convert", step_dir, "--json", "--dtype", "bf16")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    target = step_dir / "export-bf16" / layout.MODEL_SAFETENSORS
    assert data["files"] == [str(target)]
    assert data["num_tensors"] == 3
    assert data["dtype"] == "BF16"
    got = load_file(target)
    assert torch.equal(got["w"], TENSORS["w"].to(torch.bfloat16))
    assert torch.equal(got["n"], TENSORS["n"])


def test_existing_output_is_refused_in_one_line(step_dir: Path) -> None:
    assert run_ckpt("convert", step_dir).exit_code == 0
    result = run_ckpt("convert", step_dir)
    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1
    assert "--overwrite" in result.stderr


def test_to_dcp_and_back(step_dir: Path, tmp_path: Path) -> None:
    model_dir = step_dir / layout.PRETRAINED_MODEL_DIR
    assert run_ckpt("convert", model_dir, "--delete-dcp").exit_code == 0
    assert not (model_dir / layout.MODEL_DCP_DIR).exists()
    result = run_ckpt("convert", model_dir, "--to", "dcp", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["files"] == [str(model_dir / layout.MODEL_DCP_DIR)]
    out = tmp_path / "again"
    assert run_ckpt("convert", model_dir / layout.MODEL_DCP_DIR, "--output", out).exit_code == 0
    got = load_file(out / layout.MODEL_SAFETENSORS)
    assert all(torch.equal(got[k], v) for k, v in TENSORS.items())


def test_long_dtype_names_and_underscore_spellings(step_dir: Path, tmp_path: Path) -> None:
    """bfloat16 as --policy.dtype spells it, and LeRobot's --delete_dcp / --max_shard_size."""
    out = tmp_path / "bf16"
    result = run_ckpt(
        "convert", step_dir, "--dtype", "bfloat16", "--max_shard_size", "1GB", "--output", out, "--json"
    )
    assert result.exit_code == 0, result.stderr
    assert {t.dtype for t in load_file(out / layout.MODEL_SAFETENSORS).values() if t.is_floating_point()} == {
        torch.bfloat16
    }
    model_dir = step_dir / layout.PRETRAINED_MODEL_DIR
    assert run_ckpt("convert", step_dir, "--delete_dcp", "--overwrite").exit_code == 0
    assert not (model_dir / layout.MODEL_DCP_DIR).exists()
    result = run_ckpt("convert", step_dir, "--to", "dcp", "--push_to_hub", "user/model", "--json")
    assert result.exit_code == 2 and "apply to DCP -> safetensors" in json.loads(result.stdout)["error"]


def test_bad_flags_are_usage_errors(step_dir: Path) -> None:
    assert run_ckpt("convert", step_dir, "--max-shard-size", "lots").exit_code == 2
    assert run_ckpt("convert", step_dir, "--dtype", "int3").exit_code == 2
    assert run_ckpt("convert", step_dir, "--to", "onnx").exit_code == 2


def _one_line_failure(*args: object) -> str:
    result = run_ckpt(*[str(a) for a in args])
    assert result.exit_code == 1
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr
    return result.stderr


def test_bad_inputs_fail_with_one_line(step_dir: Path, tmp_path: Path) -> None:
    dcp_dir = step_dir / layout.PRETRAINED_MODEL_DIR / layout.MODEL_DCP_DIR
    assert "no such file" in _one_line_failure("convert", tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    result = run_ckpt("convert", tmp_path / "empty", "--json")
    assert (result.exit_code, result.stderr) == (1, "")
    assert "no DCP shards" in json.loads(result.stdout)["error"]
    shard = next(p for p in dcp_dir.iterdir() if p.suffix == ".distcp")
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    assert "truncated" in _one_line_failure("convert", step_dir)
    shard.write_bytes(data)


def test_refused_pickle_runs_nothing(tmp_path: Path) -> None:
    target = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {target}",))

    bad = tmp_path / "bad_dcp"
    bad.mkdir()
    (bad / layout.DCP_METADATA).write_bytes(pickle.dumps(Payload()))
    assert "refused" in _one_line_failure("convert", bad)
    assert not target.exists()
    assert not (tmp_path / layout.MODEL_SAFETENSORS).exists()
