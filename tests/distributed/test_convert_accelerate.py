"""`ckpt convert` on what accelerate's own `save_state` writes under FSDP2 (not a hand-made imitation).

One torchrun launch (2 gloo ranks) shards the trainer's ACT policy through the trainer's accelerate
factory, trains a step and calls `accelerator.save_state`; the CLI then converts its
`pytorch_model_fsdp_0/` and the result is compared with the gathered full state dict.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ckpt_tools import layout
from helpers.launch import CKPT_CLI, run_torchrun

pytestmark = pytest.mark.distributed

SCRIPT = Path(__file__).parent / "scripts" / "convert_accelerate_save_state.py"


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """OUT/state (accelerate's save_state directory) and OUT/reference.pt."""
    out = tmp_path_factory.mktemp("accelerate_save_state")
    run_torchrun(SCRIPT, 2, str(out), timeout=180)
    return out


def ckpt(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CKPT_CLI, *map(str, args)], capture_output=True, text=True, timeout=60)


def test_save_state_model_shards_convert_bit_exact(saved: Path, tmp_path: Path) -> None:
    shards = saved / "state" / layout.MODEL_DCP_DIR
    assert sorted(p.name for p in shards.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    result = ckpt("convert", shards, "--output", tmp_path, "--json")
    assert result.returncode == 0, result.stderr
    target = tmp_path / layout.MODEL_SAFETENSORS
    assert json.loads(result.stdout)["files"] == [str(target)]
    reference = torch.load(saved / "reference.pt")
    assert reference["placements"] == "(Shard(dim=0),)"  # the model really was FSDP2-sharded
    got = load_file(target)
    assert sorted(got) == sorted(reference["names"])  # the unwrapped model's names, no `model.` prefix
    assert sorted(reference["state"]) == sorted(got)
    for name, tensor in reference["state"].items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name


def test_save_state_optimizer_shards_are_refused(saved: Path, tmp_path: Path) -> None:
    result = ckpt("convert", saved / "state" / "optimizer_0", "--output", tmp_path / "out")
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and layout.MODEL_DCP_DIR in result.stderr
    assert not (tmp_path / "out").exists()


def test_save_state_is_read_by_every_command_as_accelerate_s_layout(saved: Path, tmp_path: Path) -> None:
    """The catalog reads save_state's `{"model": ...}` shards as the model and its `optimizer_0/` as
    optimizer state only: load, inspect, verify, diff and push agree on it (no new launch)."""
    import ckpt_tools
    from ckpt_tools.catalog import ACCELERATE_DCP, catalog
    from ckpt_tools.reports.diff import diff_checkpoints

    shards = saved / "state" / layout.MODEL_DCP_DIR
    reference = torch.load(saved / "reference.pt")["state"]
    assert catalog(shards).layout == ACCELERATE_DCP and catalog(shards).labels == ("dcp",)
    loaded = ckpt_tools.load_model_state_dict(shards)
    assert sorted(loaded) == sorted(reference)
    assert all(torch.equal(loaded[name], tensor) for name, tensor in reference.items())
    optimizer = ckpt_tools.describe_checkpoint(saved / "state" / "optimizer_0")
    assert optimizer.formats == ("optimizer dcp",)
    for path in (shards, saved / "state" / "optimizer_0"):
        report = ckpt_tools.verify_checkpoint(path)
        assert report.ok, report.problems
    converted = tmp_path / "converted"
    ckpt_tools.convert_dcp_to_safetensors(shards, converted)
    diff = diff_checkpoints(shards, converted)
    assert not diff.differs and not diff.only_a and not diff.only_b
    pushed = ckpt("push", shards, tmp_path / "published")
    assert pushed.returncode == 1 and "run `ckpt convert" in pushed.stderr
