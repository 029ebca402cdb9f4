"""LeRobot's FastWAM checkpoint (tests/fixtures/lerobot_fastwam_tiny) fine-tuned on 4 gloo ranks, one
torchrun launch (scripts/fastwam_run.py): FSDP2 over the 4 and HSDP (2 replicas x 2 shards), sharded by
MoT layer, take DDP's losses and gradient norms and train every one of LeRobot's tensors under its own
name; the frozen UMT5 and VAE never enter a checkpoint."""

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
    launch = run_torchrun(
        SCRIPT, 4, str(work / "out"), str(work), "fsdp2", "hsdp", "ddp", "recompute", timeout=450
    )
    return work / "out", launch.stdout


def _logged(run: Path, key: str) -> list[float]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r[key] for r in records if r.get("event") == "train"]


@pytest.mark.parametrize("sharded", ["fsdp2", "hsdp"])
def test_sharded_runs_fine_tune_lerobots_fastwam_as_ddp_does(runs, sharded: str) -> None:
    """One unit per MoT layer and per projection in it, the embeddings and the heads; the same losses and
    gradient norms as DDP on the same 4 ranks; every one of the 139 tensors trained under LeRobot's name,
    nothing of the frozen parts saved."""
    out, stdout = runs
    units = "MoTLayer, Projection, VideoExpert, ActionExpert, VideoHead, ActionHead"
    assert stdout.count(f"FSDP units by class: {units}") == 3  # fsdp2, hsdp and recompute, not ddp
    for key in ("loss", "grad_norm"):
        tuned_run, ddp = _logged(out / sharded, key), _logged(out / "ddp", key)
        assert len(tuned_run) == 2
        np.testing.assert_allclose(tuned_run, ddp, rtol=1e-5)
    base = load_file(str(fixture_dir("lerobot_fastwam_tiny", "pretrained_model", "model.safetensors")))
    tuned = load_file(
        str(out / sharded / "checkpoints" / "000002" / "pretrained_model" / "model.safetensors")
    )
    assert tuned.keys() == base.keys() and len(tuned) == 139
    assert all(not torch.equal(tuned[name], base[name]) for name in base)


def test_a_recomputed_layer_holds_one_projection_gathered_at_a_time(runs) -> None:
    """Under `use_gradient_checkpointing` each MoT layer runs again in the backward pass. FSDP2 would
    keep every unit of that recompute gathered until its own backward (a whole block's projections at
    once); on CPU the engine ungathers each as its recomputed forward ends and gathers it again for its
    backward (distributed/factory.py). The losses and gradient norms stay DDP's."""
    out, _ = runs
    for key in ("loss", "grad_norm"):
        np.testing.assert_allclose(_logged(out / "recompute", key), _logged(out / "ddp", key), rtol=1e-5)
    for rank in range(4):
        seen = json.loads((out / "recompute" / f"gathered.rank{rank}.json").read_text())
        assert seen["projections"] == 2 * 2 * 10  # 2 layers x 2 blocks x (4 + 4 attention, 2 FFN)
        assert seen["most_gathered"] == 1, seen
