"""SmolVLA sharded on 2 gloo ranks, one torchrun launch (scripts/smolvla_run.py): a unit per decoder
layer (the naive choice) fails, since SmolVLA never calls a decoder layer's forward(); the policy's own
units (the parts whose forward() runs) train exactly as DDP does, the token table read on each rank's
rows and never gathered, the sharded run saves LeRobot's tensor names, and LoRA on LeRobot's default
targets trains under FSDP2; HSDP 2x2 trains as DDP does on 4 ranks (a second launch). The first launch also fine-tunes LeRobot's ACT checkpoint under FSDP2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

import ckpt_tools
import trainer
from helpers.fixtures import fixture_dir
from helpers.launch import run_torchrun
from helpers.run_outputs import metrics, saved_model
from trainer.data.dataset import task_bytes
from trainer.evaluation.lerobot_export import export_lerobot
from trainer.policies.act import lerobot as act_lerobot

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]

SCRIPT = Path(__file__).parent / "scripts" / "smolvla_run.py"


def _workdir(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    work = tmp_path_factory.mktemp(name)
    shutil.copytree(fixture_dir("lerobot_smolvla_tiny", "tiny_smolvlm"), work / "tiny_smolvlm")
    shutil.copytree(fixture_dir("lerobot", "dataset_video"), work / "dataset_video")
    shutil.copytree(fixture_dir("lerobot", "dataset_tiny"), work / "dataset_tiny")
    shutil.copytree(fixture_dir("lerobot", "checkpoint_act", "checkpoints", "000002"), work / "lerobot_act")
    return work


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    work = _workdir(tmp_path_factory, "smolvla_sharded")
    return work, run_torchrun(SCRIPT, 2, str(work / "out"), str(work), timeout=400).stdout


def _shapes(path: Path) -> dict[str, list[int]]:
    with safe_open(str(path), "pt") as handle:
        return {key: list(handle.get_slice(key).get_shape()) for key in handle.keys()}  # noqa: SIM118


def _headers(path: Path) -> dict[str, tuple[str, list[int]]]:
    with safe_open(str(path), "pt") as handle:
        slices = {key: handle.get_slice(key) for key in handle.keys()}  # noqa: SIM118
    return {key: (piece.get_dtype(), list(piece.get_shape())) for key, piece in slices.items()}


def _losses(run: Path) -> list[float]:
    records = metrics(run)
    return [r["loss"] for r in records if r.get("event") == "train"]


def test_a_unit_per_decoder_layer_is_never_gathered(runs) -> None:
    _, stdout = runs
    assert stdout.count("naive failed: RuntimeError:") == 2  # on both ranks, at the first forward
    assert "mixed torch.Tensor and DTensor" in stdout


def test_fsdp2_with_the_policys_units_trains_as_ddp_does(runs) -> None:
    work, stdout = runs
    assert "FSDP units by class: SmolVLMEncoderLayer, LlamaMLP, Linear, Embedding" in stdout
    assert "returned a view tensor" not in stdout  # FSDP2's per-forward warning on Linear units, silenced
    fsdp2, ddp = _losses(work / "out" / "fsdp2"), _losses(work / "out" / "ddp")
    assert len(fsdp2) == 3
    np.testing.assert_allclose(fsdp2, ddp, rtol=1e-5)


def test_the_token_table_is_read_on_each_ranks_rows_never_gathered(runs) -> None:
    """Under FSDP2 the VLM's token table (384 rows here; SmolVLM2-500M's 49,280 x 960) is a unit of its
    own, read on each rank's rows (policies/common/vocab_parallel.py) and never run by its forward, which would
    gather it whole; the vision tower's position embedding (64 rows) is a unit whose forward runs. The
    losses equal DDP's (the test above), which looks the table up by its forward."""
    _, stdout = runs
    # fsdp2: 3 steps x one lookup per prefix (on both ranks); DDP: the forward, no lookup
    assert "token table of fsdp2: 3 row-sharded lookups, embedding units run: [64]" in stdout
    assert "token table of ddp: 0 row-sharded lookups, embedding units run: []" in stdout


def test_the_fsdp2_run_resumed_on_ddp_trains_the_step_ddp_trains(runs) -> None:
    """A changed-topology resume (docs/resume.md): FSDP2 x2's step 2 resumed on DDP x2 takes the third
    step's loss within fp32 rounding of the DDP run's (the same samples, noise and flow time)."""
    work, _ = runs
    resumed = metrics(work / "out" / "fsdp2_to_ddp", "train")
    assert [record["step"] for record in resumed] == [3]
    np.testing.assert_allclose([resumed[0]["loss"]], _losses(work / "out" / "ddp")[2:], rtol=1e-5)


def test_the_sharded_run_saves_lerobots_tensors_and_acts_as_ddps(runs, monkeypatch) -> None:
    work, _ = runs
    monkeypatch.chdir(work)  # the config names its backbone by the relative path tiny_smolvlm
    lerobot = fixture_dir("lerobot_smolvla_tiny", "pretrained_model", "model.safetensors")
    steps = {name: work / "out" / name / "checkpoints" / "last" for name in ("fsdp2", "ddp")}
    assert _shapes(steps["fsdp2"] / "pretrained_model" / "model.safetensors") == _shapes(lerobot)
    policies = {name: trainer.load_policy(str(step)).policy for name, step in steps.items()}
    g = torch.Generator().manual_seed(0)
    batch = {
        "observation.state": torch.randn(2, 4, generator=g),
        "observation.images.top": torch.rand(2, 3, 24, 40, generator=g),
        "observation.images.wrist": torch.rand(2, 3, 24, 40, generator=g),
        "task": task_bytes(["reach the corner the colour names", "push"]),
    }
    noise = torch.randn(2, 5, 32, generator=g)
    actions = {name: p.predict_action_chunk(batch, noise=noise) for name, p in policies.items()}
    torch.testing.assert_close(actions["fsdp2"], actions["ddp"], rtol=1e-4, atol=1e-5)


def test_lora_under_fsdp2_trains_lerobots_default_targets(runs) -> None:
    """The expert's q/v projections and the state/action/time projections, the VLM untouched."""
    work, _ = runs
    model_dir = saved_model(work / "out" / "lora")
    with safe_open(str(model_dir / "adapter_model.safetensors"), "pt") as handle:
        names = list(handle.keys())
        lora_b = [handle.get_tensor(n) for n in names if ".lora_B." in n]
    targets = {name.split(".lora_")[0].removeprefix("base_model.model.model.") for name in names}
    expert = {f"vlm_with_expert.lm_expert.layers.{i}.self_attn.{p}_proj" for i in range(4) for p in "qv"}
    heads = {"state_proj", "action_in_proj", "action_out_proj", "action_time_mlp_in", "action_time_mlp_out"}
    assert targets == expert | heads
    assert any(t.abs().sum() > 0 for t in lora_b)  # the adapters moved from their zero start


def test_hsdp_2x2_trains_as_ddp_does_on_4_ranks(tmp_path_factory: pytest.TempPathFactory) -> None:
    work = _workdir(tmp_path_factory, "smolvla_hsdp")
    stdout = run_torchrun(SCRIPT, 4, str(work / "out"), str(work), "hsdp", timeout=400).stdout
    assert "HSDP 2x2 (4 processes" in stdout
    hsdp, ddp = _losses(work / "out" / "hsdp"), _losses(work / "out" / "ddp4")
    assert len(hsdp) == 2
    np.testing.assert_allclose(hsdp, ddp, rtol=1e-5)


def test_lerobots_act_checkpoint_fine_tunes_on_fsdp2(runs) -> None:
    """--policy.path=<LeRobot's ACT step> on 2 ranks: its weights under our names, trained for 2 steps;
    `trainer export` maps the tuned step back to LeRobot's tensors (names, shapes, dtypes) and config."""
    work, _ = runs
    base = act_lerobot.state_from_lerobot(
        load_file(str(work / "lerobot_act" / "pretrained_model" / "model.safetensors"))
    )
    step = work / "out" / "act_lerobot" / "checkpoints" / "last"
    topology = ckpt_tools.read_training_step(str(step)).topology
    assert (topology.dp_replicate, topology.dp_shard) == (1, 2)
    tuned = trainer.load_policy(str(step)).policy
    after = tuned.state_dict()
    assert set(after) == set(base) and len(_losses(work / "out" / "act_lerobot")) == 2
    assert all(after[name].shape == tensor.shape for name, tensor in base.items())
    assert not torch.equal(after["action_head.weight"], base["action_head.weight"])
    lerobot = work / "lerobot_act" / "pretrained_model"
    export_lerobot(str(step), str(work / "act_exported"))
    exported = work / "act_exported"
    assert _headers(exported / "model.safetensors") == _headers(lerobot / "model.safetensors")
    saved = json.loads((lerobot / "config.json").read_text())
    assert json.loads((exported / "config.json").read_text()).keys() == saved.keys()
    back = act_lerobot.state_from_lerobot(load_file(str(exported / "model.safetensors")))
    assert all(torch.equal(back[name], tensor) for name, tensor in after.items())
