"""Two torchrun agents on loopback stand in for two machines: an HSDP run replicated across the
"nodes" and sharded inside each, then resumed on one node with FSDP2 over 2 processes.

The agents meet through torch's c10d rendezvous (`--rdzv-backend=c10d`), exactly as on a cluster; only
the address is 127.0.0.1. The resume reads the step saved by 4 ranks on 2 nodes into 2 ranks, in the
same output directory (what a shared filesystem gives every node), and continues it: with the global
batch kept, its step 4 matches the two-node run's step 4 within fp32 rounding (see test_resume.py).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

import ckpt_tools
from helpers.launch import CKPT_CLI, run_torchrun, run_torchrun_nodes
from helpers.run_outputs import metrics, model_file

pytestmark = [pytest.mark.distributed, pytest.mark.slow, pytest.mark.timeout(300)]

SCRIPT = Path(__file__).parent / "scripts" / "train_cli.py"
RTOL = 1e-5


def losses(out: Path) -> dict[int, float]:
    records = metrics(out)
    return {r["step"]: r["loss"] for r in records if r.get("event") == "train"}


def test_two_nodes_hsdp_then_resume_on_one_node_fsdp2(tmp_path):
    out = tmp_path / "run"
    flags = [
        f"--output_dir={out}",
        f"--dataset.cache_dir={tmp_path / 'cache'}",
        "--policy.type=mlp",
        "--policy.hidden_dim=16",
        "--policy.dropout=0",
        "--dataset.episodes=1",
        "--dataset.eval_episodes=0",
        "--steps=4",
        "--save_freq=2",
        "--log_freq=1",
        "--seed=3",
    ]
    hsdp = ["--parallelism.dp_replicate=2", "--parallelism.dp_shard=2", "--batch_size=8"]
    node0, node1 = run_torchrun_nodes(SCRIPT, 2, 2, *flags, *hsdp, "--checkpoint_format=dcp")
    assert "HSDP" in node0 + node1, node0
    saved = ckpt_tools.read_training_step(out / "checkpoints" / "000002")
    assert (saved.dp_world_size, saved.topology.dp_replicate, saved.topology.dp_shard) == (4, 2, 2)
    two_nodes_step4 = ckpt_tools.load_model_state_dict(out / "checkpoints" / "000004")
    two_nodes_losses = losses(out)

    config = model_file(out, 2, "train_config.json")
    fsdp2 = ["--parallelism.dp_replicate=1", "--parallelism.dp_shard=2", "--batch_size=16"]
    result = run_torchrun(SCRIPT, 2, "--resume=true", f"--config_path={config}", *fsdp2)
    assert f"resuming from {out / 'checkpoints' / '000002'} at step 2" in result.stdout, result.stdout
    assert os.readlink(out / "checkpoints" / "last") == "000004"
    resumed = ckpt_tools.read_training_step(out / "checkpoints" / "000004")
    assert (resumed.dp_world_size, resumed.topology.dp_replicate, resumed.topology.dp_shard) == (2, 1, 2)
    for step in (3, 4):
        assert losses(out)[step] == pytest.approx(two_nodes_losses[step], rel=RTOL, abs=0), step
    got = ckpt_tools.load_model_state_dict(out / "checkpoints" / "000004")
    assert got.keys() == two_nodes_step4.keys()
    for key, tensor in two_nodes_step4.items():
        torch.testing.assert_close(got[key], tensor, rtol=1e-4, atol=1e-6)
    verified = subprocess.run([str(CKPT_CLI), "verify", str(out)], capture_output=True, text=True, timeout=60)
    assert verified.returncode == 0, verified.stdout + verified.stderr
