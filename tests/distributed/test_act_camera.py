"""Camera ACT on 2 gloo ranks through the real trainer, one torchrun launch (scripts/act_camera_run.py):
FSDP2 shards it with the transformer layers and the trunk's stages as units and trains exactly as
DDP does, both roll out on every rank from pixels, and LoRA on the attention projections trains under
FSDP2 with the base frozen."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import trainer
from helpers.launch import run_torchrun
from helpers.run_outputs import metrics, saved_model
from helpers.train_flags import TINY_LEROBOT_ACT
from trainer.data.embedded import sim

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]

SCRIPT = Path(__file__).parent / "scripts" / "act_camera_run.py"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("act_camera")
    return out, run_torchrun(SCRIPT, 2, str(out), *TINY_LEROBOT_ACT, timeout=300).stdout


def _records(run: Path) -> list[dict]:
    return metrics(run)


def test_fsdp2_units_are_the_layers_and_trunk_stages(runs) -> None:
    out, _ = runs
    banner = _records(out / "fsdp2")[0]["banner"]
    assert "FSDP units by class: ACTEncoderLayer, ACTDecoderLayer, ResNetStage" in " ".join(banner)
    assert any("DTensor placements (Shard(dim=0),)" in line for line in banner)


def test_fsdp2_trains_as_ddp_does(runs) -> None:
    out, _ = runs
    losses = {
        name: [r["loss"] for r in _records(out / name) if r.get("event") == "train"]
        for name in ("fsdp2", "ddp")
    }
    assert len(losses["fsdp2"]) == 2
    np.testing.assert_allclose(losses["fsdp2"], losses["ddp"], rtol=1e-5)
    fsdp2, ddp = (trainer.load_policy(str(out / n / "checkpoints" / "last")) for n in ("fsdp2", "ddp"))
    state = np.zeros((2, 3), np.float32)
    frames = np.stack([sim.render(np.array([1.0, 0.0, 0.0], np.float32), t) for t in (0.5, -2.0)])
    obs = {"observation.state": state, sim.CAMERA: frames}
    torch.testing.assert_close(fsdp2.select_action(obs), ddp.select_action(obs), rtol=1e-4, atol=1e-5)


def test_both_roll_out_from_pixels_on_every_rank(runs) -> None:
    _, stdout = runs
    assert stdout.count("evaluation over 2 episodes") == 2  # the fsdp2 and ddp runs, printed once each


def test_lora_under_fsdp2_trains_the_attention_adapters_only(runs) -> None:
    out, _ = runs
    model_dir = saved_model(out / "lora")
    adapter = load_file(str(model_dir / "adapter_model.safetensors"))
    targets = {name.split(".lora_")[0].rsplit(".", 1)[-1] for name in adapter}
    assert targets == {"q_proj", "k_proj", "v_proj", "out_proj"}
    assert all(".lora_A." in n or ".lora_B." in n for n in adapter)
    assert any(n.startswith("base_model.model.encoder.layers.0.") for n in adapter)
    assert not (model_dir / "model.safetensors").exists()
    lora_b = [t for n, t in adapter.items() if ".lora_B." in n]
    assert any(t.abs().sum() > 0 for t in lora_b)  # the adapters moved from their zero start
    loaded = trainer.load_policy(str(model_dir))  # merged into the fsdp2 base it records
    frames = sim.render(np.array([1.0, 0.0, 0.0], np.float32), 1.0)
    assert loaded.select_action({"observation.state": np.zeros(3, np.float32), sim.CAMERA: frames}).shape == (
        1,
    )


def test_acts_own_metrics_are_averaged_over_the_ranks_as_the_loss_is(runs) -> None:
    """ACT's loss is `l1_loss + kl_weight * kld_loss` on each rank; the logged values (one step per log)
    keep that sum only if both metrics are averaged over the ranks as the loss is, not one rank's."""
    out, _ = runs
    logged = {
        name: [r for r in _records(out / name) if r.get("event") == "train"]
        for name in ("fsdp2", "ddp", "lora")
    }
    for name, records in logged.items():
        assert len(records) == 2, name
        for record in records:
            assert record["loss"] == pytest.approx(record["l1_loss"] + 10.0 * record["kld_loss"], rel=1e-5)
    for metric in ("l1_loss", "kld_loss"):
        fsdp2, ddp = ([r[metric] for r in logged[n]] for n in ("fsdp2", "ddp"))
        np.testing.assert_allclose(fsdp2, ddp, rtol=1e-5)
