"""Checkpoints written by real gloo process groups (FSDP2 on 2 and 4 ranks, HSDP 2x2, DDP), read back
by the single-process loader and resumed across topologies, compared bit for bit with the full state
dicts the writing processes gathered.

Two torchrun launches for the whole module (session fixture): `state_write_4.py` (FSDP2 x4, then HSDP
2x2 resumed from it) and `state_write_2.py` (FSDP2 x2, FSDP2 bf16, DDP, and the cross-topology resumes).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

import ckpt_tools
from ckpt_tools.tensors.tensor_io import read_dcp_full
from helpers.launch import run_torchrun
from helpers.run_outputs import saved_model
from helpers.tiny_run import assert_same_tensors

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]

SCRIPTS = Path(__file__).parent / "scripts"
STEP = {"fsdp4": "000002", "hsdp2x2": "000003", "fsdp2": "000002", "fsdp2_bf16": "000001", "ddp2": "000002"}


@pytest.fixture(scope="session")
def written(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dcp_state")
    run_torchrun(SCRIPTS / "state_write_4.py", 4, str(out), timeout=280)
    run_torchrun(SCRIPTS / "state_write_2.py", 2, str(out), timeout=280)
    return out


def reference(written: Path, name: str) -> dict:
    return torch.load(written / name, weights_only=True)


def assert_same_full_state(got: dict, want: dict) -> None:
    assert_same_tensors(got["model"], want["model"])
    assert got["optim"]["param_groups"] == want["optim"]["param_groups"]
    assert got["optim"]["state"].keys() == want["optim"]["state"].keys()
    for fqn, entry in want["optim"]["state"].items():
        assert_same_tensors(got["optim"]["state"][fqn], entry)


def model_dir(written: Path, case: str) -> Path:
    return saved_model(written / case, STEP[case])


@pytest.mark.parametrize("case", ["fsdp4", "hsdp2x2", "fsdp2"])
def test_dcp_shards_load_bit_identical_in_one_process(written, case):
    loaded = read_dcp_full(str(model_dir(written, case) / "pytorch_model_fsdp_0"))
    assert_same_tensors(loaded, reference(written, f"{case}/reference.pt")["model"])


@pytest.mark.parametrize("case", ["fsdp4", "hsdp2x2", "fsdp2", "fsdp2_bf16", "ddp2"])
def test_load_model_state_dict_from_any_writer(written, case):
    loaded = ckpt_tools.load_model_state_dict(written / case)
    assert_same_tensors(loaded, reference(written, f"{case}/reference.pt")["model"])


def test_sharded_checkpoint_layout(written):
    step_dir = written / "fsdp4" / "checkpoints" / "000002"
    for shards in (
        step_dir / "pretrained_model" / "pytorch_model_fsdp_0",
        step_dir / "training_state" / "optimizer_0",
    ):
        assert sorted(p.name for p in shards.iterdir()) == [
            ".metadata",
            *(f"__{r}_0.distcp" for r in range(4)),
        ]
    assert not (step_dir / "training_state" / "optimizer_state.safetensors").exists()
    assert ckpt_tools.open_checkpoint(written / "fsdp4").formats == ("safetensors", "dcp")
    assert ckpt_tools.open_checkpoint(written / "hsdp2x2").formats == ("dcp",)
    topology = ckpt_tools.read_training_step(written / "hsdp2x2").topology
    assert (topology.dp_replicate, topology.dp_shard) == (2, 2)
    assert os.readlink(written / "hsdp2x2" / "checkpoints" / "last") == "000003"


def test_ddp_checkpoint_keeps_a_safetensors_optimizer(written):
    state_dir = written / "ddp2" / "checkpoints" / "000002" / "training_state"
    assert sorted(p.name for p in state_dir.iterdir()) == [
        "optimizer_param_groups.json",
        "optimizer_state.safetensors",
        "rng_state.safetensors",
        "training_step.json",
    ]
    assert ckpt_tools.open_checkpoint(written / "ddp2").formats == ("safetensors",)


def test_gathered_safetensors_hold_fp32_masters_under_bf16_compute(written):
    with safe_open(model_dir(written, "fsdp2_bf16") / "model.safetensors", framework="pt") as handle:
        assert {handle.get_slice(k).get_dtype() for k in handle.keys()} == {"F32"}  # noqa: SIM118


@pytest.mark.parametrize(
    ("resumed", "source"),
    [
        ("fsdp4_to_fsdp2", "fsdp4"),  # 4 -> 2 ranks
        ("fsdp4_to_hsdp", "fsdp4"),  # FSDP2 -> HSDP
        ("hsdp_to_fsdp2", "hsdp2x2"),  # HSDP -> FSDP2, 4 -> 2 ranks
        ("ddp2_to_fsdp2", "ddp2"),  # non-sharded safetensors -> sharded
        ("fsdp2_to_ddp", "fsdp2"),  # DCP -> non-sharded
        ("fsdp2_to_fsdp2", "fsdp2"),
    ],
)
def test_resume_restores_model_and_optimizer_across_topologies(written, resumed, source):
    got = reference(written, f"resumed/{resumed}.pt")
    assert_same_full_state(got, reference(written, f"{source}/reference.pt"))


def test_sharded_resume_from_safetensors_reads_only_each_ranks_rows(written):
    """DDP's gathered model.safetensors and optimizer_state.safetensors into FSDP2 on 2 ranks (bit-exact
    above): each rank reads the rows of its own shards with ranged reads, never a whole file, so
    together they read each file once."""
    reads = torch.load(written / "resumed" / "ddp2_to_fsdp2.reads.pt", weights_only=True)
    saved = reference(written, "ddp2/reference.pt")
    file_bytes = sum(t.nbytes for t in saved["model"].values())
    moments_bytes = sum(t.nbytes for state in saved["optim"]["state"].values() for t in state.values())
    assert not any(rank["whole_file"] or rank["whole_optimizer"] for rank in reads)
    for rank in reads:
        assert 0 < rank["model_bytes"] <= rank["shard_bytes"] + 5 * 4  # + the replicated `scale` buffer
        assert 0 < rank["optimizer_bytes"] <= rank["optimizer_shard_bytes"]  # its moments and step counts
    assert sum(rank["model_bytes"] for rank in reads) < 1.3 * file_bytes
    assert sum(rank["optimizer_bytes"] for rank in reads) < 1.3 * moments_bytes


def test_training_after_resume_matches_uninterrupted_training(written):
    resumed = reference(written, "resumed/fsdp2_continued.pt")
    assert_same_full_state(resumed, reference(written, "fsdp2/continued.pt"))


def test_rng_state_holds_every_rank_and_maps_onto_fewer_ranks(written):
    path = written / "fsdp4" / "checkpoints" / "000002" / "training_state" / "rng_state.safetensors"
    expected = [torch.manual_seed(7000 + rank).get_state() for rank in range(4)]
    with safe_open(path, framework="pt") as handle:
        assert handle.metadata()["world_size"] == "4"
        for rank in range(4):
            assert torch.equal(handle.get_tensor(f"rank{rank}/torch"), expected[rank])
    on_two = torch.load(written / "resumed" / "rng_fsdp4_on_2.pt", weights_only=True)
    assert all(torch.equal(on_two[rank], expected[rank]) for rank in range(2))
