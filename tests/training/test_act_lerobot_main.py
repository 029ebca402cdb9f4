"""An ACT trained by LeRobot main's parallel engine (FSDP2 x2, tests/fixtures/lerobot_main_dcp):
`--policy.path` fine-tunes from its DCP-only step as from the step that also holds
`model.safetensors`; `trainer.load_policy` and `trainer export` read it as LeRobot's weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import trainer
from helpers.fixtures import copy_fixture
from trainer.cli.parse import parse_config
from trainer.engine.plan import train
from trainer.errors import ConfigError
from trainer.evaluation.lerobot_export import export_lerobot
from trainer.policies.act import lerobot as act_lerobot

STEP = Path("checkpoints") / "000002"


@pytest.fixture(scope="module")
def fixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_fixture(tmp_path_factory.mktemp("main"), "lerobot_main_dcp")


def _merged(fixture: Path) -> dict[str, torch.Tensor]:
    """LeRobot's own merge of the DCP step (`lerobot-convert-dcp`), under LeRobot's names."""
    return load_file(fixture / "lerobot_convert_dcp" / "a_000002_model.safetensors")


def test_load_policy_reads_the_dcp_step_as_lerobots_weights(fixture: Path) -> None:
    loaded = trainer.load_policy(str(fixture / "a_fsdp2x2_dcp" / STEP))
    want = act_lerobot.state_from_lerobot(_merged(fixture))
    got = loaded.policy.state_dict()
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
    assert loaded.policy.config.env_state_dim == 3


def test_export_writes_lerobots_tensors_back(fixture: Path, tmp_path: Path) -> None:
    export_lerobot(str(fixture / "a_fsdp2x2_dcp" / STEP), str(tmp_path / "export"))
    got, want = load_file(tmp_path / "export" / "model.safetensors"), _merged(fixture)
    assert sorted(got) == sorted(want)
    assert all(torch.equal(got[k], want[k]) for k in want if k != "model.vae_encoder_pos_enc")


def test_policy_path_fine_tunes_from_the_dcp_step(
    fixture: Path, tmp_path: Path, monkeypatch, clean_accelerate
) -> None:
    """From (a)'s DCP-only step and from (b)'s `pretrained_model/` (whose model.safetensors is
    bit-identical to (a)'s shards): the same first update, a small step away from LeRobot's weights."""
    from accelerate.state import AcceleratorState

    monkeypatch.chdir(fixture)  # train_config.json's paths are relative to the fixture's top level
    tuned = {}
    for name, path in (
        ("dcp", fixture / "a_fsdp2x2_dcp" / STEP),
        ("safetensors", fixture / "b_fsdp2x2_safetensors_dcp" / STEP / "pretrained_model"),
    ):
        flags = [f"--policy.path={path}", "--dataset.root=dataset", "--batch_size=2", "--num_workers=0"]
        train(parse_config([*flags, "--steps=1", "--seed=3", f"--output_dir={tmp_path / name}"]))
        AcceleratorState._reset_state(reset_partial_state=True)
        tuned[name] = trainer.load_policy(str(tmp_path / name / "checkpoints" / "last")).policy.state_dict()
    base = act_lerobot.state_from_lerobot(_merged(fixture))
    assert all(torch.equal(tuned["dcp"][k], tuned["safetensors"][k]) for k in base)
    moved = max((tuned["dcp"][k] - base[k]).abs().max().item() for k in base)
    assert 0 < moved <= 1.5e-5  # one AdamW update at LeRobot's lr 1e-5 from LeRobot's weights


def test_lerobots_train_config_asks_for_resume_in_one_line(fixture: Path, monkeypatch) -> None:
    """LeRobot's train_config.json is no config of ours: without --resume=true it is one line naming
    both ways to use it (it used to be a draccus dump of the whole dataset section)."""
    monkeypatch.chdir(fixture)
    config = STEP / "pretrained_model" / "train_config.json"
    with pytest.raises(ConfigError) as caught:
        parse_config([f"--config_path={Path('a_fsdp2x2_dcp') / config}"])
    message = str(caught.value)
    assert "\n" not in message and "--resume=true" in message and "--policy.path=" in message
    parsed = parse_config([f"--config_path={Path('a_fsdp2x2_dcp') / config}", "--resume=true"])
    assert parsed.resume and parsed.policy.path.endswith("000002/pretrained_model")
    assert (parsed.batch_size, parsed.steps, parsed.seed, parsed.parallelism.dp_shard) == (2, 4, 1, 2)
    assert parsed.scheduler.describe() == "constant"  # LeRobot's "scheduler": null
