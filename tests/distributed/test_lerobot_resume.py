"""A LeRobot run continues here: `--resume=true --config_path=<LeRobot main step>/pretrained_model/
train_config.json` (tests/fixtures/lerobot_main_dcp, written by LeRobot main's own FSDP2 x2 engine)
restores, on FSDP2 x2, HSDP 2x2 and one process, LeRobot's weights, AdamW moments and step counts
(LeRobot's FQNs through ACT's tensor-name mapping), its RNG and its step, bit for bit as the files hold
them; what cannot carry over (LeRobot's sampler order) is named on one line and in the resume record,
and the run trains on and saves. One launch per topology serves every assertion about it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from ckpt_tools.tensors.tensor_io import read_dcp_full
from helpers.fixtures import copy_fixture
from helpers.launch import run_torchrun
from trainer.policies.act import lerobot as act_lerobot

pytestmark = pytest.mark.distributed

SCRIPT = Path(__file__).parent / "scripts" / "lerobot_resume.py"
STEP = Path("a_fsdp2x2_dcp") / "checkpoints" / "000002"
CONFIG = STEP / "pretrained_model" / "train_config.json"
TOPOLOGIES = {  # name: (processes, flags, the placements the state lands on)
    "fsdp2x2": (2, [], "(Shard(dim=0),)"),
    "hsdp2x2": (4, ["--parallelism.dp_replicate=2"], "(Replicate(), Shard(dim=0))"),
    "single": (1, ["--parallelism.dp_shard=1"], "plain tensor"),
}
NOT_CARRIED = "LeRobot's sampler order does not carry over"


@pytest.fixture(scope="module")
def fixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_fixture(tmp_path_factory.mktemp("lerobot_main"), "lerobot_main_dcp")


@pytest.fixture(scope="module", params=list(TOPOLOGIES))
def resumed(request: pytest.FixtureRequest, fixture: Path, tmp_path_factory: pytest.TempPathFactory):
    """One resume of LeRobot's step 2 on the topology, trained on to step 3: (observed, output, run)."""
    nproc, flags, _ = TOPOLOGIES[request.param]
    run = tmp_path_factory.mktemp(request.param)
    observed = run / "observed.pt"
    command = [f"--config_path={CONFIG}", "--resume=true", f"--output_dir={run / 'out'}", "--steps=3", *flags]
    result = run_torchrun(SCRIPT, nproc, str(observed), str(fixture), *command, timeout=420)
    return torch.load(observed, weights_only=False), result.stdout, run / "out", request.param


def _lerobot_optimizer(fixture: Path) -> dict[str, dict[str, torch.Tensor]]:
    """LeRobot's optimizer_0/ as the files hold it: {lerobot fqn: {exp_avg, exp_avg_sq, step}}."""
    out: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in read_dcp_full(str(fixture / STEP / "training_state" / "optimizer_0")).items():
        fqn, _, key = name.removeprefix("optimizer.state.").rpartition(".")
        out.setdefault(fqn, {})[key] = tensor
    return out


def test_weights_are_lerobots_bit_for_bit(resumed, fixture: Path) -> None:
    observed, _, _, topology = resumed
    want = act_lerobot.state_from_lerobot(
        load_file(fixture / "lerobot_convert_dcp" / "a_000002_model.safetensors")
    )
    got = observed["model"]
    assert sorted(got) == sorted(want)
    assert all(torch.equal(got[name], want[name]) for name in want)
    assert observed["placements"] == TOPOLOGIES[topology][2]


def test_adamw_moments_and_steps_are_lerobots_bit_for_bit(resumed, fixture: Path) -> None:
    observed, _, _, _ = resumed
    saved = _lerobot_optimizer(fixture)
    state = observed["optimizer"]["state"]
    for key in ("exp_avg", "exp_avg_sq"):
        want = act_lerobot.state_from_lerobot({fqn: s[key] for fqn, s in saved.items()})
        assert sorted(want) == sorted(state)  # every trained parameter, under our names
        assert all(torch.equal(state[fqn][key], want[fqn]) for fqn in want), key
    steps = {float(s["step"]) for s in saved.values()}
    assert steps == {2.0}
    assert all(s["step"].dtype == torch.float32 and float(s["step"]) == 2.0 for s in state.values())
    # in_proj_weight's three thirds are q, k and v: the split follows LeRobot's fused layout
    fused = saved["model.encoder.layers.0.self_attn.in_proj_weight"]["exp_avg"]
    assert torch.equal(state["encoder.layers.0.self_attn.k_proj.weight"]["exp_avg"], fused.chunk(3)[1])


def test_rng_step_and_offset_are_lerobots(resumed, fixture: Path) -> None:
    observed, _, _, topology = resumed
    rng = load_file(fixture / STEP / "training_state" / "rng_state.safetensors")
    assert len(observed["rng"]) == TOPOLOGIES[topology][0]
    for python, numpy_state, torch_state in observed["rng"]:  # rank 0's saved state, on every rank
        assert torch.equal(torch_state, rng["torch_rng_state"])
        assert python[:2] == (int(rng["py_rng_version"]), tuple(rng["py_rng_state"].tolist()))
        assert np.array_equal(numpy_state[1], rng["np_rng_state_values"].numpy())
        assert numpy_state[2] == int(rng["np_rng_state_index"])
    assert observed["start_step"] == 2 and observed["offset"] == 8  # 2 steps x batch 2 x 2 ranks


def test_what_does_not_carry_over_is_named_and_the_run_goes_on(resumed) -> None:
    _, stdout, out, _ = resumed
    lines = [line for line in stdout.splitlines() if NOT_CARRIED in line]
    assert len(lines) == 1, stdout
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    resume = next(r for r in records if r.get("event") == "resume")
    assert resume["step"] == 2 and NOT_CARRIED in resume["not_carried"][0]
    assert any(r.get("event") == "step_losses" and r["step"] == 3 for r in records)
    assert (out / "checkpoints" / "000003" / "training_state" / "training_step.json").is_file()
