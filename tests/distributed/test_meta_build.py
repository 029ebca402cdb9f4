"""A policy built on the meta device (engine/build.py): topology-independent initialization and
`--policy.path` weights streamed into the shards.

The same `--seed` on one process, DDP x2, FSDP2 x4 and HSDP 2x2 (FSDP2 x2 along its shard dimension),
and a LoRA run on one process and FSDP2 x2: each run's weights are gathered right after they are
materialized and initialized, and must be equal bit for bit; the sharded runs must really be sharded,
and materializing must keep the parameter objects the optimizer holds. Two runs started from a saved step (`--policy.path`) must hold exactly
its weights. One process and FSDP2 x4 save Hugging Face style shards (`--save_shard_size`): FSDP2 x2
reads the one-process set block by block, and FSDP2 x4's shards hold the DCP shards' values.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load, save

import ckpt_tools
from ckpt_tools import layout
from helpers.launch import run_torchrun
from helpers.run_outputs import saved_model
from helpers.train_flags import tiny_args

# The module fixture launches 8 one-step runs (1 to 4 ranks each, every rank importing torch): 84 s on
# an idle 2-core machine, but past the suite's 300 s at load average 10, which took every test of the
# module down with it. 900 s keeps it far from a time-out on a busy machine (each launch keeps its own 240 s).
pytestmark = [pytest.mark.distributed, pytest.mark.timeout(900)]

SCRIPT = Path(__file__).parent / "scripts" / "train_observe_init.py"

SHARDS = "--save_shard_size=8KiB"  # the policy's ~40 KB of weights in several shards
RUNS: dict[str, tuple[int, list[str]]] = {
    "single": (1, [SHARDS]),
    "ddp2": (2, []),
    "fsdp4": (4, ["--parallelism.dp_shard=4", "--checkpoint_format=safetensors_dcp", SHARDS]),
    "hsdp2x2": (4, ["--parallelism.dp_replicate=2", "--parallelism.dp_shard=2", "--checkpoint_format=dcp"]),
}
# --policy.path runs started from the step-1 checkpoint an earlier run saved: sharded safetensors read
# block by block into FSDP2 x2 shards, DCP shards of HSDP 2x2 into DDP's full copies
LOADS: dict[str, tuple[int, list[str], str]] = {
    "fsdp2_from_safetensors": (2, ["--parallelism.dp_shard=2"], "single"),
    "ddp2_from_dcp": (2, [], "hsdp2x2"),
}
# LoRA runs (--peft.*) built on meta too: one process and FSDP2 x2 must start from the same bits
LORA = ["--peft.method_type=LORA", "--peft.r=4", "--peft.alpha=8"]
LORA_RUNS: dict[str, tuple[int, list[str]]] = {
    "single_lora": (1, LORA),
    "fsdp2_lora": (2, ["--parallelism.dp_shard=2", *LORA]),
}
# a policy with a parameter of its own (act_state's context) and blocks whose shards differ per rank
POLICY = ["--policy.type=act_state", "--policy.dim=24", "--policy.ffn_dim=40", "--seed=7"]


def _checkpoint(root: Path, run: str) -> Path:
    return root / run / "checkpoints" / "000001"


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("meta_build")
    results = {}
    launches = [(name, nproc, flags) for name, (nproc, flags) in (RUNS | LORA_RUNS).items()]
    launches += [
        (name, nproc, [*flags, f"--policy.path={_checkpoint(root, source)}"])
        for name, (nproc, flags, source) in LOADS.items()
    ]
    for name, nproc, flags in launches:
        observed = root / f"{name}.pt"
        args = tiny_args(str(root / name), str(root / "cache"), *POLICY, *flags, "--steps=1", "--save_freq=1")
        run_torchrun(SCRIPT, nproc, str(observed), *args, timeout=240)
        results[name] = torch.load(observed, weights_only=True)
    for name, (_, _, source) in LOADS.items():
        results[name]["expected"] = ckpt_tools.load_model_state_dict(str(_checkpoint(root, source)))
    results["root"] = root
    return results


@pytest.mark.parametrize("name", [n for n in RUNS if n != "single"])
def test_every_topology_starts_from_the_same_bits(started: dict[str, Any], name: str) -> None:
    reference, observed = started["single"]["state"], started[name]["state"]
    assert observed.keys() == reference.keys()
    differing = [key for key in reference if not torch.equal(observed[key], reference[key])]
    assert not differing, f"{name} starts from other values than one process: {differing[:5]}"
    buffers = started[name]["buffers"]
    assert all(torch.equal(buffers[k], v) for k, v in started["single"]["buffers"].items())


def test_lora_runs_start_from_the_same_bits_on_one_process_and_fsdp2(started: dict[str, Any]) -> None:
    """A LoRA run built on meta and sharded starts from exactly what one process starts from, the
    adapters included: each B zero (the adapted policy computes what its base does), each A drawn."""
    reference, observed = started["single_lora"]["state"], started["fsdp2_lora"]["state"]
    assert observed.keys() == reference.keys()
    differing = [key for key in reference if not torch.equal(observed[key], reference[key])]
    assert not differing, f"FSDP2 x2 starts its LoRA run from other values than one process: {differing[:5]}"
    assert "Shard(dim=0)" in started["fsdp2_lora"]["placements"]
    lora_a = [v for k, v in reference.items() if ".lora_A." in k]
    lora_b = [v for k, v in reference.items() if ".lora_B." in k]
    assert lora_a and len(lora_a) == len(lora_b)
    assert all(not b.any() for b in lora_b) and all(a.unique().numel() == a.numel() for a in lora_a)


def test_the_weights_are_drawn_not_left_empty(started: dict[str, Any]) -> None:
    """Every weight matrix holds distinct finite values: initialized, not zeros or an uninitialized block."""
    for key, value in started["single"]["state"].items():
        assert torch.isfinite(value).all(), key
        if value.dim() == 2:
            assert value.unique().numel() > value.numel() // 2, key


@pytest.mark.parametrize("name", ["fsdp4", "hsdp2x2", "fsdp2_from_safetensors"])
def test_sharded_runs_materialize_their_shards_in_place(started: dict[str, Any], name: str) -> None:
    assert "Shard(dim=0)" in started[name]["placements"]
    assert started[name]["same_params"]


@pytest.mark.parametrize("name", list(LOADS))
def test_policy_path_weights_stream_into_the_shards_as_an_eager_load(
    started: dict[str, Any], name: str
) -> None:
    """The weights each rank read as the blocks it holds, gathered, equal the checkpoint read whole
    (as the eager `--policy.path` load reads it); the computed buffers still equal a fresh build's."""
    expected, observed = started[name]["expected"], started[name]["state"]
    source = _checkpoint(started["root"], LOADS[name][2]) / layout.PRETRAINED_MODEL_DIR
    assert (source / layout.MODEL_INDEX).exists() == (LOADS[name][2] == "single")  # the sharded set
    assert observed.keys() == expected.keys()
    assert all(torch.equal(observed[k], expected[k]) for k in expected)
    assert not torch.equal(observed["context"], started["single"]["state"]["context"])  # trained, not drawn
    buffers = started[name]["buffers"]
    assert all(torch.equal(buffers[k], v) for k, v in started["single"]["buffers"].items())


def test_a_sharded_safetensors_save_writes_the_gathered_files_bytes(started: dict[str, Any]) -> None:
    """FSDP2 x4 wrote its --save_shard_size shards tensor by tensor (state/gathered_write.py): each has the
    bytes the safetensors library writes for its tensors, the index names them all, and together they
    hold the DCP shards' values gathered."""
    step = saved_model(started["root"] / "fsdp4", 1)
    weight_map = json.loads((step / layout.MODEL_INDEX).read_text())["weight_map"]
    shards = sorted(set(weight_map.values()))
    assert len(shards) > 1 and not (step / layout.MODEL_SAFETENSORS).exists()
    tensors: dict[str, torch.Tensor] = {}
    for shard in shards:
        written = (step / shard).read_bytes()
        assert written == save(load(written), metadata={"format": "pt"}), shard
        tensors |= load(written)
    assert sorted(weight_map) == sorted(tensors)
    from_dcp = ckpt_tools.load_model_state_dict(str(step / "pytorch_model_fsdp_0"))
    assert tensors.keys() == from_dcp.keys() and all(torch.equal(tensors[k], from_dcp[k]) for k in tensors)


def test_load_policy_and_verify_take_a_sharded_step(started: dict[str, Any]) -> None:
    """`trainer.load_policy` reads the one-process run's sharded set as its weights; `ckpt verify --deep`
    checks its shards and index against the step's manifest."""
    from trainer.evaluation.inference import load_policy

    step = _checkpoint(started["root"], "single")
    loaded = load_policy(str(step)).policy.state_dict()
    expected = ckpt_tools.load_model_state_dict(str(step))
    assert loaded.keys() == expected.keys() and all(torch.equal(loaded[k], expected[k]) for k in expected)
    assert ckpt_tools.verify_checkpoint(step, deep=True).ok
