"""`ckpt convert --to dcp`: published safetensors weights start an FSDP2 run, bit for bit.

A one-process `trainer train` run publishes `model.safetensors` (with its config.json); the CLI turns it
into `pytorch_model_fsdp_0/` and the safetensors file is dropped, so the DCP shards are all a run can
read. A 2-rank FSDP2 `trainer train --policy.path=...` (one torchrun launch) records the weights it
starts from after prepare, and the same shards loaded by DCP straight into its DTensor shards.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ckpt_tools import layout
from helpers.launch import CKPT_CLI, run_torchrun
from helpers.train_flags import tiny_args

pytestmark = pytest.mark.distributed

SCRIPT = Path(__file__).parent / "scripts" / "train_observe_start.py"


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Published weights, the conversion's JSON and stderr, and what the FSDP2 run started from."""
    root = tmp_path_factory.mktemp("convert_to_dcp")
    cache = str(root / "dataset_cache")
    source_run = [sys.executable, "-m", "trainer.cli", "train", *tiny_args(str(root / "source"), cache)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(source_run, check=True, capture_output=True, env=env, timeout=120)
    published = root / "source" / "checkpoints" / "000004" / layout.PRETRAINED_MODEL_DIR
    model_dir = root / "from_dcp"
    shutil.copytree(published, model_dir)
    convert = subprocess.run(
        [CKPT_CLI, "convert", model_dir, "--to", "dcp", "--json"], capture_output=True, text=True, timeout=120
    )
    assert convert.returncode == 0, convert.stderr
    (model_dir / layout.MODEL_SAFETENSORS).unlink()  # the run can only read the DCP shards
    observed = root / "observed.pt"
    flags = tiny_args(str(root / "fsdp2"), cache, "--parallelism.dp_shard=2", "--steps=1", "--seed=7")
    log = run_torchrun(SCRIPT, 2, str(observed), f"--policy.path={model_dir}", *flags, timeout=180).stdout
    return {
        "source": load_file(published / layout.MODEL_SAFETENSORS),
        "model_dir": model_dir,
        "convert": convert,
        "observed": torch.load(observed),
        "log": log,
        "run": root / "fsdp2",
    }


def test_to_dcp_writes_shards_beside_the_weights_quietly(started) -> None:
    result = json.loads(started["convert"].stdout)
    assert result["files"] == [str(started["model_dir"] / layout.MODEL_DCP_DIR)]
    assert result["num_tensors"] == len(started["source"])
    assert started["convert"].stderr == ""


def test_fsdp2_run_starts_from_the_converted_weights_bit_exact(started) -> None:
    observed, source = started["observed"], started["source"]
    assert observed["placements"] == "(Shard(dim=0),)" and "FSDP2 2 (" in started["log"]
    assert sorted(observed["started"]) == sorted(source)
    for name, tensor in source.items():
        assert torch.equal(observed["started"][name], tensor), name
    assert (started["run"] / "checkpoints" / "000001").is_dir()  # and it trained on from them


def test_dcp_shards_load_onto_the_runs_sharded_layout_bit_exact(started) -> None:
    """Written by one process, read by DCP into the 2-rank run's own DTensor shards (resharded)."""
    loaded, source = started["observed"]["dcp_loaded"], started["source"]
    assert sorted(loaded) == sorted(source)
    for name, tensor in source.items():
        assert torch.equal(loaded[name], tensor), name
