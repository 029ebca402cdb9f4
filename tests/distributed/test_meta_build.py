"""Topology-independent initialization of a policy built on the meta device (engine/build.py).

The same `--seed` on one process, DDP x2, FSDP2 x2 and x4 and HSDP 2x2: each run's weights are
gathered right after they are materialized and initialized, and must be equal bit for bit; the sharded
runs must really be sharded, and materializing must keep the parameter objects the optimizer holds.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helpers.launch import run_torchrun
from helpers.train_flags import tiny_args

pytestmark = pytest.mark.distributed

SCRIPT = Path(__file__).parent / "scripts" / "train_observe_init.py"

RUNS: dict[str, tuple[int, list[str]]] = {
    "single": (1, []),
    "ddp2": (2, []),
    "fsdp2": (2, ["--parallelism.dp_shard=2"]),
    "fsdp4": (4, ["--parallelism.dp_shard=4"]),
    "hsdp2x2": (4, ["--parallelism.dp_replicate=2", "--parallelism.dp_shard=2"]),
}
# a policy with a parameter of its own (act_state's context) and blocks whose shards differ per rank
POLICY = ["--policy.type=act_state", "--policy.dim=24", "--policy.ffn_dim=40", "--seed=7"]


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("meta_build")
    results = {}
    for name, (nproc, flags) in RUNS.items():
        observed = root / f"{name}.pt"
        args = tiny_args(str(root / name), str(root / "cache"), *POLICY, *flags, "--steps=1", "--save_freq=1")
        run_torchrun(SCRIPT, nproc, str(observed), *args, timeout=240)
        results[name] = torch.load(observed, weights_only=True)
    return results


@pytest.mark.parametrize("name", [n for n in RUNS if n != "single"])
def test_every_topology_starts_from_the_same_bits(started: dict[str, dict], name: str) -> None:
    reference, observed = started["single"]["state"], started[name]["state"]
    assert observed.keys() == reference.keys()
    differing = [key for key in reference if not torch.equal(observed[key], reference[key])]
    assert not differing, f"{name} starts from other values than one process: {differing[:5]}"
    buffers = started[name]["buffers"]
    assert all(torch.equal(buffers[k], v) for k, v in started["single"]["buffers"].items())


def test_the_weights_are_drawn_not_left_empty(started: dict[str, dict]) -> None:
    """Every weight matrix holds distinct finite values: initialized, not zeros or an uninitialized block."""
    for key, value in started["single"]["state"].items():
        assert torch.isfinite(value).all(), key
        if value.dim() == 2:
            assert value.unique().numel() > value.numel() // 2, key


@pytest.mark.parametrize("name", ["fsdp2", "fsdp4", "hsdp2x2"])
def test_sharded_runs_materialize_their_shards_in_place(started: dict[str, dict], name: str) -> None:
    assert "Shard(dim=0)" in started[name]["placements"]
    assert started[name]["same_params"]
