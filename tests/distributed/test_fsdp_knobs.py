"""The --accelerator.fsdp.* knobs observed on a real 2-rank FSDP2 `trainer train` (DESIGN 5).

Two torchrun launches of the real CLI, each rank recording what torch made of the flags right after
prepare and during the first training forward (scripts/train_fsdp_knobs.py):
  offload  MLP policy, bf16 autocast, cpu_offload, reshard_after_forward=false and a full
           mixed_precision_policy (param bfloat16, reduce float32, output float32), units by size
           (min_num_params: the blocks, not their ModuleList nor the Linear inside each);
  ignored  ACT policy, ignored_modules=head (the policy's class-based units).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ckpt_tools import layout
from helpers.launch import run_torchrun
from helpers.train_flags import tiny_args

pytestmark = pytest.mark.distributed

SCRIPT = Path(__file__).parent / "scripts" / "train_fsdp_knobs.py"
POLICY = {"param_dtype": "torch.bfloat16", "reduce_dtype": "torch.float32", "output_dtype": "torch.float32"}
RUNS = {
    "offload": (
        "--policy.type=mlp",
        "--accelerator.mixed_precision=bf16",
        "--accelerator.fsdp.cpu_offload=true",
        "--accelerator.fsdp.reshard_after_forward=false",
        "--accelerator.fsdp.mixed_precision_policy.param_dtype=bfloat16",
        "--accelerator.fsdp.mixed_precision_policy.reduce_dtype=float32",
        "--accelerator.fsdp.mixed_precision_policy.output_dtype=float32",
        "--accelerator.fsdp.min_num_params=10000",
    ),
    "ignored": ("--accelerator.fsdp.ignored_modules=head",),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Per run: both ranks' records, the output directory and the launch log."""
    root = tmp_path_factory.mktemp("fsdp_knobs")
    out = {}
    for name, extra in RUNS.items():
        flags = tiny_args(
            str(root / name), str(root / "cache"), "--parallelism.dp_shard=2", "--steps=2", *extra
        )
        log = run_torchrun(SCRIPT, 2, str(root / name) + "_observed", *flags, timeout=180).stdout
        ranks = [torch.load(f"{root / name}_observed.rank{r}.pt") for r in range(2)]
        out[name] = {"ranks": ranks, "dir": root / name, "log": log}
    return out


def _train_config(run: dict) -> dict:
    path = run["dir"] / "checkpoints" / "000002" / layout.PRETRAINED_MODEL_DIR / layout.TRAIN_CONFIG
    return json.loads(path.read_text())


def test_every_unit_holds_the_flag_policy_and_the_cpu_offload(runs) -> None:
    for record in runs["offload"]["ranks"]:
        assert sorted(record["units"]) == ["", "blocks.0", "blocks.1"]
        for name, unit in record["units"].items():
            assert unit["mp_policy"] == {**POLICY, "cast_forward_inputs": True}, name
            assert unit["group_mp_is_state_mp"], name
            assert (unit["offload"], unit["pin_memory"]) == ("CPUOffloadPolicy", False), name
            assert unit["offload_to_cpu"] == [True] * unit["num_params"], name


def test_units_stay_unsharded_after_forward_in_the_policy_dtypes(runs) -> None:
    """After the root's forward: blocks still hold their full bfloat16 parameters (reshard off) and
    returned float32 (output_dtype); with the default the units are resharded by then."""
    for record in runs["offload"]["ranks"]:
        assert [u["reshard_after_forward"] for n, u in record["units"].items() if n] == [False, False]
        forward = record["forward"]
        assert forward["unsharded"] == {"blocks.0": True, "blocks.1": True}
        assert forward["output_dtype"] == {"blocks.0": "torch.float32", "blocks.1": "torch.float32"}
        for name in ("blocks.0", "blocks.1"):
            assert forward["held_param"][name] == ("linear.weight", "Parameter", "torch.bfloat16", (128, 128))
    for record in runs["ignored"]["ranks"]:
        assert not any(record["forward"]["unsharded"].values())


def test_banner_and_train_config_record_the_effective_policy(runs) -> None:
    run = runs["offload"]
    assert (
        "FSDP units by size: modules with > 10000 parameters (MLPBlock); mixed precision policy "
        "param_dtype=bfloat16 reduce_dtype=float32 "
        "output_dtype=float32" in run["log"]
    )
    fsdp = _train_config(run)["accelerator"]["fsdp"]
    assert fsdp["mixed_precision_policy"] == {
        "param_dtype": "bfloat16",
        "reduce_dtype": "float32",
        "output_dtype": "float32",
        "cast_forward_inputs": None,
    }
    assert (fsdp["cpu_offload"], fsdp["reshard_after_forward"]) == (True, False)


def test_ignored_modules_stay_whole_on_every_rank(runs) -> None:
    run = runs["ignored"]
    for record in run["ranks"]:
        assert sorted(record["units"]) == ["", "decoder.0", "encoder.0", "encoder.1"]
        for name, unit in record["units"].items():
            assert unit["mp_policy"]["param_dtype"] == "None" and unit["offload"] == "OffloadPolicy", name
        plain = sorted(n for n, kind in record["params"].items() if kind == "Tensor")
        assert plain == ["head.0.bias", "head.0.weight", "head.1.bias", "head.1.weight"]
        assert all(kind == "DTensor" for n, kind in record["params"].items() if not n.startswith("head."))
    assert _train_config(run)["accelerator"]["fsdp"]["ignored_modules"] == "head"


def test_ignored_parameters_agree_across_ranks_after_training(runs) -> None:
    first, second = (record["plain_after"] for record in runs["ignored"]["ranks"])
    assert sorted(first) == sorted(second)
    for name, tensor in first.items():
        assert torch.equal(tensor, second[name]), name


def test_ignored_gradients_are_the_mean_of_the_ranks_gradients(runs) -> None:
    """FSDP2 leaves ignored parameters' gradients alone: the trainer averages them over the ranks, so
    the update each rank applies is the one of the global batch (not the sum, not its own)."""
    first, second = (record["plain_grads"] for record in runs["ignored"]["ranks"])
    assert first.keys() == second.keys() and any(name.startswith("head.") for name in first)
    for name in first:
        local = (first[name]["local"], second[name]["local"])
        assert not torch.equal(*local), name  # the ranks saw different samples
        mean = (local[0] + local[1]) / 2
        for rank in (first, second):
            torch.testing.assert_close(rank[name]["accumulated"], mean, rtol=1e-6, atol=1e-9)
