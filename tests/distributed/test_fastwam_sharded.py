"""LeRobot's FastWAM checkpoint (tests/fixtures/lerobot_fastwam_tiny) fine-tuned on 2 gloo ranks, one
torchrun launch (scripts/fastwam_run.py): FSDP2, sharded by MoT layer, takes DDP's losses and trains
every one of LeRobot's tensors under its own name; the frozen UMT5 and VAE never enter a checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from helpers.fixtures import copy_fixture, fixture_dir
from helpers.launch import run_torchrun

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(500), pytest.mark.usefixtures("one_thread")]

SCRIPT = Path(__file__).parent / "scripts" / "fastwam_run.py"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    work = copy_fixture(tmp_path_factory.mktemp("fastwam_sharded"), "lerobot_fastwam_tiny")
    launch = run_torchrun(SCRIPT, 2, str(work / "out"), str(work), "fsdp2", "ddp", timeout=450)
    return work / "out", launch.stdout


def _logged(run: Path, key: str) -> list[float]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r[key] for r in records if r.get("event") == "train"]


def test_fsdp2_fine_tunes_lerobots_fastwam_as_ddp_does(runs) -> None:
    """One unit per MoT layer and per projection in it, the embeddings and the heads; the same losses and gradient norms as DDP;
    every one of the 139 tensors trained under LeRobot's name, nothing of the frozen parts saved."""
    out, stdout = runs
    units = "MoTLayer, Projection, VideoExpert, ActionExpert, VideoHead, ActionHead"
    assert stdout.count(f"FSDP units by class: {units}") == 1
    for key in ("loss", "grad_norm"):
        fsdp2, ddp = _logged(out / "fsdp2", key), _logged(out / "ddp", key)
        assert len(fsdp2) == 2
        np.testing.assert_allclose(fsdp2, ddp, rtol=1e-5)
    base = load_file(str(fixture_dir("lerobot_fastwam_tiny", "pretrained_model", "model.safetensors")))
    tuned = load_file(
        str(out / "fsdp2" / "checkpoints" / "000002" / "pretrained_model" / "model.safetensors")
    )
    assert tuned.keys() == base.keys() and len(tuned) == 139
    assert all(not torch.equal(tuned[name], base[name]) for name in base)
