"""LeRobot's Diffusion Policy checkpoint (tests/fixtures/lerobot_diffusion_tiny) fine-tuned on 2 gloo ranks
with an EMA, one torchrun launch (scripts/diffusion_run.py): FSDP2 takes DDP's losses, the shadow kept on
the shards is the EMA of the saved weights bit for bit, and the result exports in LeRobot's form (its
config.json, its 213 tensor names, the EMA's weights) acting as the checkpoint does. That LeRobot itself
loads the export and samples the same actions is `benchmarks/lerobot_side.py check` (LeRobot's venv);
HSDP (4 ranks) is run by hand (docs/diffusion.md)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import ckpt_tools
import trainer
from helpers.fixtures import fixture_dir
from helpers.launch import run_torchrun
from helpers.run_outputs import metrics, saved_model
from trainer.config.ema import EmaConfig
from trainer.evaluation.lerobot_export import export_lerobot

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(400), pytest.mark.usefixtures("one_thread")]

SCRIPT = Path(__file__).parent / "scripts" / "diffusion_run.py"
LEROBOT = ("lerobot_diffusion_tiny", "pretrained_model")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    work = tmp_path_factory.mktemp("diffusion_sharded")
    shutil.copytree(fixture_dir("lerobot", "dataset_video"), work / "dataset_video")
    shutil.copytree(fixture_dir("lerobot_diffusion_tiny"), work / "lerobot_diffusion_tiny")
    launch = run_torchrun(SCRIPT, 2, str(work / "out"), str(work), "fsdp2", "ddp", timeout=360)
    return work / "out", launch.stdout


def _weights(out: Path, run: str, step: int, name: str = "model.safetensors") -> dict[str, torch.Tensor]:
    return load_file(str(saved_model(out / run, step) / name))


def _losses(run: Path) -> list[float]:
    records = metrics(run)
    return [r["loss"] for r in records if r.get("event") == "train"]


def test_fsdp2_fine_tunes_lerobots_checkpoint_as_ddp_does(runs) -> None:
    """The same samples, crops and noise per rank: the same losses; every one of LeRobot's tensors
    trained under its own name (the trunk's position grid is a buffer, kept)."""
    out, stdout = runs
    assert stdout.count("FSDP units by class: ResidualBlock1d, ResNetStage") == 1
    fsdp2, ddp = _losses(out / "fsdp2"), _losses(out / "ddp")
    assert len(fsdp2) == 2 and fsdp2[1] < fsdp2[0]
    np.testing.assert_allclose(fsdp2, ddp, rtol=1e-5)
    base = load_file(str(fixture_dir(*LEROBOT, "model.safetensors")))
    tuned = _weights(out, "fsdp2", 2)
    assert tuned.keys() == base.keys() and len(tuned) == 213
    changed = [name for name in base if not torch.equal(tuned[name], base[name])]
    assert len(changed) == 212 and "diffusion.rgb_encoder.pool.pos_grid" not in changed


def test_the_sharded_ema_is_the_saved_weights_moving_average(runs) -> None:
    """Update 1 copies the weights (decay 0), update 2 lerps towards them by 1 - decay_at(2): the
    shadow each rank kept on its shards equals that average of the gathered weights, bit for bit."""
    out, _ = runs
    first, second = _weights(out, "fsdp2", 1), _weights(out, "fsdp2", 2)
    shadow_1, shadow_2 = (_weights(out, "fsdp2", step, "ema.safetensors") for step in (1, 2))
    assert shadow_2.keys() == first.keys() - {"diffusion.rgb_encoder.pool.pos_grid"}  # parameters only
    decay = EmaConfig().decay_at(2)
    assert 0 < decay < 1
    for name, value in shadow_2.items():
        assert torch.equal(shadow_1[name], first[name]), name
        assert torch.equal(value, torch.lerp(first[name], second[name], 1 - decay)), name
    assert sum(not torch.equal(value, second[name]) for name, value in shadow_2.items()) == 212


def test_the_sharded_result_exports_in_lerobots_form_and_acts_as_loaded(runs, tmp_path) -> None:
    """`trainer export` of the FSDP2 run: LeRobot's config.json (but the device, which a run leaves to
    the machine) and the EMA's weights under LeRobot's names; the export acts as the checkpoint acts."""
    out, _ = runs
    checkpoint = out / "fsdp2" / "checkpoints" / "last"
    export_lerobot(str(checkpoint), str(tmp_path / "export"))
    written = json.loads((tmp_path / "export" / "config.json").read_text())
    theirs = json.loads(fixture_dir(*LEROBOT, "config.json").read_text())
    written.pop("device"), theirs.pop("device")
    assert written == theirs
    exported = load_file(str(tmp_path / "export" / "model.safetensors"))
    expected = ckpt_tools.load_model_state_dict(checkpoint, weights="ema")
    assert exported.keys() == expected.keys() and all(torch.equal(exported[k], expected[k]) for k in expected)
    generator = torch.Generator().manual_seed(0)
    observation = {
        "observation.state": torch.randn(4, generator=generator).tolist(),
        **{f"observation.images.{c}": torch.rand(3, 24, 40, generator=generator) for c in ("top", "wrist")},
    }
    actions = []
    for source in (checkpoint, tmp_path / "export"):
        torch.manual_seed(3)
        actions.append(trainer.load_policy(str(source)).select_action(observation))
    assert actions[0].shape == (2,) and torch.equal(actions[0], actions[1])
