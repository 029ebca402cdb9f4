"""`ckpt convert --push-to-hub`: convert, publish, and only then (with --delete-dcp) remove the shards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from huggingface_hub import ModelCard
from publish_fixtures import make_step_dir, save_real_dcp
from safetensors.numpy import load

from ckpt_tools import layout
from helpers.hub_server import HubServer

REPO = "acme/act-converted"


def _convert(step_dir: Path, hub: HubServer, *args: str) -> subprocess.CompletedProcess[str]:
    ckpt = Path(sys.executable).parent / "ckpt"
    env = {**os.environ, "HF_ENDPOINT": hub.url}
    command = [str(ckpt), "convert", str(step_dir), "--push-to-hub", REPO, "--delete-dcp", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


def test_convert_then_push_then_delete_the_shards(tmp_path, hub):
    step_dir = make_step_dir(tmp_path, weights="none", with_dcp=False)
    model = step_dir / layout.PRETRAINED_MODEL_DIR
    expected = save_real_dcp(model)

    done = _convert(step_dir, hub, "--json")

    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["deleted_source"] is True and report["published"]["commit_oid"]
    assert not (model / layout.MODEL_DCP_DIR).exists()
    arrived = hub.files(REPO)
    assert layout.MODEL_SAFETENSORS in arrived and layout.TRAIN_CONFIG in arrived
    assert not [name for name in arrived if name.endswith(layout.DCP_SHARD_SUFFIX)]
    weights = load(arrived[layout.MODEL_SAFETENSORS])
    assert sorted(weights) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(weights[name], value)
        assert weights[name].dtype == value.dtype
    assert "| Steps | 10 |" in ModelCard(arrived["README.md"].decode()).text
    assert len(hub.repo(REPO).commits) == 1


def test_a_failed_push_keeps_the_shards(tmp_path, hub):
    step_dir = make_step_dir(tmp_path, weights="none", with_dcp=False)
    model = step_dir / layout.PRETRAINED_MODEL_DIR
    save_real_dcp(model)
    shards = sorted(p.name for p in (model / layout.MODEL_DCP_DIR).iterdir())
    hub.fail("commit", 500)

    failed = _convert(step_dir, hub)

    assert failed.returncode == 1
    assert "error: Hub server error (HTTP 500)" in failed.stderr and "nothing was deleted" in failed.stderr
    assert sorted(p.name for p in (model / layout.MODEL_DCP_DIR).iterdir()) == shards
    assert (model / layout.MODEL_SAFETENSORS).exists()  # the conversion itself succeeded and stays
