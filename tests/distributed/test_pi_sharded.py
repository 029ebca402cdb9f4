"""pi0 and pi0.5 sharded by torch's FSDP2 on 2 gloo ranks with the policy's own units (each
JointLayer, each SigLIP encoder layer, the root), one torchrun launch (scripts/pi_fsdp2.py): the
sharded loss is the unsharded one bit for bit and LeRobot's, the gradients those of one process, and
a chunk sampled sharded is LeRobot's. A unit whose forward() never ran would leave its parameters
sharded and fail the forward: the joint layers are called, not read."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers.fixtures import fixture_dir
from helpers.launch import run_torchrun

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(400)]

SCRIPT = Path(__file__).parent / "scripts" / "pi_fsdp2.py"
KINDS = ("lerobot_pi0_tiny", "lerobot_pi05_tiny")


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    work = tmp_path_factory.mktemp("pi_sharded")
    folders = [shutil.copytree(fixture_dir(kind), work / kind) for kind in KINDS]
    (work / "out").mkdir()
    run_torchrun(SCRIPT, 2, str(work / "out"), *map(str, folders), timeout=360)
    return {kind: json.loads((work / "out" / f"{kind}.json").read_text()) for kind in KINDS}


@pytest.mark.parametrize(("kind", "grads"), [("lerobot_pi0_tiny", 81), ("lerobot_pi05_tiny", 84)])
def test_fsdp2_on_the_joint_layers_gives_lerobots_loss_and_the_same_gradients(
    results, kind: str, grads: int
) -> None:
    result = results[kind]
    assert result["sharded_loss"] == result["plain_loss"]
    assert abs(result["sharded_loss"] - result["reference_loss"]) < 1e-5
    assert result["same_grad_names"] and result["grads"] == grads  # every trainable tensor but the 7 unread
    assert result["max_grad_diff"] < 1e-6
    assert result["max_action_diff"] < 1e-5
