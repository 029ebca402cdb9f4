"""Our ACT written for LeRobot (`trainer export`): LeRobot's checkpoint (lerobot-train 0.6.1) through
ours and back is its own tensors bit for bit under its names, shapes and dtypes; the config.json has
LeRobot's ACTConfig keys and types; an ACT trained here (cameras, EMA) exported and read back acts
exactly as before; what LeRobot cannot read is one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

import ckpt_tools
import trainer
from helpers.fixtures import copy_fixture
from trainer.cli.app import main
from trainer.cli.parse import parse_config
from trainer.engine.plan import train
from trainer.errors import ConfigError
from trainer.evaluation.lerobot_export import export_lerobot, lerobot_adapter
from trainer.policies import act
from trainer.policies.act import lerobot as act_lerobot
from trainer.policies.act.state import ACTStateConfig
from trainer.policies.mlp import MLPConfig

MODEL = Path(__file__).parents[1] / "fixtures" / "lerobot" / "checkpoint_act" / "checkpoints" / "000002"
MODEL = MODEL / "pretrained_model"
TINY = [
    "--policy.dim_model=16", "--policy.n_heads=2", "--policy.dim_feedforward=32", "--policy.n_encoder_layers=1",
    "--policy.n_vae_encoder_layers=1", "--policy.latent_dim=4", "--policy.chunk_size=4", "--policy.n_action_steps=4",
    "--policy.pretrained_backbone_weights=null",
]  # fmt: skip


def _headers(path: Path) -> dict[str, tuple[str, list[int]]]:
    with safe_open(str(path), "pt") as handle:
        return {
            key: (handle.get_slice(key).get_dtype(), list(handle.get_slice(key).get_shape()))
            for key in handle.keys()  # noqa: SIM118
        }


def test_lerobots_act_to_ours_and_back_is_its_own_tensors_bit_for_bit() -> None:
    theirs = load_file(str(MODEL / "model.safetensors"))
    table = act.sinusoidal_1d(7, 32)[None]  # [CLS, robot state, 5 actions] x dim_model: LeRobot's numpy table
    back = act_lerobot.state_to_lerobot(act_lerobot.state_from_lerobot(theirs), table)
    assert back.keys() == theirs.keys()
    assert all(back[n].dtype == t.dtype and torch.equal(back[n], t) for n, t in theirs.items())


def test_the_export_of_lerobots_checkpoint_is_that_checkpoint(tmp_path: Path) -> None:
    """Read as ours (q/k/v split, the table recomputed), written as LeRobot's: the same header, the
    same tensors, the same config.json."""
    written = export_lerobot(str(MODEL), str(tmp_path / "out"))
    out = tmp_path / "out"
    assert written[:2] == ["config.json", "model.safetensors"]
    assert _headers(out / "model.safetensors") == _headers(MODEL / "model.safetensors")
    theirs, ours = load_file(str(MODEL / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert all(torch.equal(ours[n], t) for n, t in theirs.items())
    assert json.loads((out / "config.json").read_text()) == json.loads((MODEL / "config.json").read_text())


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """An ACT trained here from scratch (two cameras and a state, EMA kept, 2 steps) and its export."""
    from accelerate.state import AcceleratorState

    work = tmp_path_factory.mktemp("act_export")
    copy_fixture(work, "lerobot", "dataset_images")
    flags = [*TINY, "--policy.type=act", f"--dataset.root={work / 'dataset_images'}", "--batch_size=2"]
    flags += ["--num_workers=0", "--steps=2", "--ema.enable=true", f"--output_dir={work / 'run'}"]
    AcceleratorState._reset_state(reset_partial_state=True)
    train(parse_config(flags))
    AcceleratorState._reset_state(reset_partial_state=True)
    step = work / "run" / "checkpoints" / "last"
    export_lerobot(str(step), str(work / "lerobot"))
    return step, work / "lerobot"


def test_the_config_json_has_lerobots_keys_and_types(trained) -> None:
    _, exported = trained
    theirs = json.loads((MODEL / "config.json").read_text())
    ours = json.loads((exported / "config.json").read_text())
    assert list(ours) == list(theirs)
    differ = [k for k in theirs if None not in (ours[k], theirs[k]) and type(ours[k]) is not type(theirs[k])]
    assert differ == []
    assert ours["input_features"] == {
        "observation.state": {"type": "STATE", "shape": [4]},
        "observation.images.top": {"type": "VISUAL", "shape": [3, 24, 40]},
        "observation.images.wrist": {"type": "VISUAL", "shape": [3, 24, 40]},
    }
    assert ours["output_features"] == {"action": {"type": "ACTION", "shape": [2]}}
    assert (ours["dim_model"], ours["chunk_size"], ours["pretrained_backbone_weights"]) == (16, 4, None)


def test_the_weights_are_lerobots_names_of_the_ema_the_run_kept(trained) -> None:
    step, exported = trained
    saved = load_file(str(exported / "model.safetensors"))
    assert all(name.startswith("model.") for name in saved)
    assert saved["model.encoder.layers.0.self_attn.in_proj_weight"].shape == (48, 16)
    assert {"model.backbone.layer4.1.bn2.running_var", "model.decoder.layers.0.linear1.bias"} <= saved.keys()
    assert not any("q_proj" in name or ".ffn." in name for name in saved)
    assert torch.equal(saved["model.vae_encoder_pos_enc"], act.sinusoidal_1d(6, 16)[None])
    ema = load_file(str(step / "pretrained_model" / "ema.safetensors"))["action_head.weight"]
    assert torch.equal(saved["model.action_head.weight"], ema)  # the default weights: the EMA


def test_an_act_trained_here_acts_the_same_after_the_lerobot_names(trained) -> None:
    step, exported = trained
    rng = np.random.default_rng(0)
    observation = {
        "observation.state": rng.standard_normal((3, 4)).astype(np.float32),
        "observation.images.top": rng.integers(0, 256, (3, 24, 40, 3), dtype=np.uint8),
        "observation.images.wrist": rng.integers(0, 256, (3, 24, 40, 3), dtype=np.uint8),
    }
    before, after = trainer.load_policy(str(step)), trainer.load_policy(str(exported))
    assert before.weights == "ema" and after.weights == "model"
    for _ in range(5):  # through the action queue and into the next chunk
        assert torch.equal(before.select_action(observation), after.select_action(observation))


def test_the_export_publishes_as_it_is(trained, tmp_path) -> None:
    """`ckpt push <export> <repo>` (here a local target) uploads LeRobot's files unchanged."""
    _, exported = trained
    ckpt_tools.publish_model(str(exported), str(tmp_path / "published"))
    for name in ("config.json", "model.safetensors"):
        assert (tmp_path / "published" / name).read_bytes() == (exported / name).read_bytes()


def test_the_command_writes_the_directory_and_refuses_a_used_one(trained, tmp_path, capsys) -> None:
    step, _ = trained
    with pytest.raises(SystemExit) as done:
        main(["export", f"--policy.path={step}", f"--output_dir={tmp_path / 'x'}", "--weights=model"])
    assert done.value.code == 0 and "wrote" in capsys.readouterr().out
    assert (tmp_path / "x" / "model.safetensors").is_file()
    with pytest.raises(SystemExit) as done:
        main(["export", f"--policy.path={step}", f"--output_dir={tmp_path / 'x'}"])
    assert done.value.code == 1
    assert "exists and is not empty: choose a new directory" in capsys.readouterr().err


def test_a_step_of_a_non_sharded_run_is_no_lerobot_main_step(trained, tmp_path, capsys) -> None:
    """LeRobot main resumes DCP steps on sharded runs only, and refuses to cross from a non-sharded one:
    `--lerobot_step=true` of a one-process step is one line, and nothing is written."""
    step, _ = trained
    with pytest.raises(SystemExit) as done:
        main(["export", f"--policy.path={step}", f"--output_dir={tmp_path / 'x'}", "--lerobot_step=true"])
    err = capsys.readouterr().err
    assert done.value.code == 1 and "is a step of a non-sharded run (single process)" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "x").exists()


def test_what_lerobot_cannot_read_is_one_line() -> None:
    state_only = act.ACTConfig(obs_dim=4, action_dim=2, input_features=["observation.state"])
    with pytest.raises(ConfigError, match=r"LeRobot's ACT needs a camera or observation\.environment_state"):
        state_only.lerobot_adapter().config_to_lerobot(state_only)


@pytest.mark.parametrize("config", [MLPConfig(), ACTStateConfig()], ids=["mlp", "act_state"])
def test_an_export_of_a_policy_without_an_adapter_is_one_line(config) -> None:
    """No LeRobot adapter, no LeRobot form: one line, and the types it names as exportable are read from
    the registry (every type whose config has an adapter; no list of types is kept beside it)."""
    with pytest.raises(ConfigError, match=f"a {config.type} policy has no LeRobot form") as caught:
        lerobot_adapter(config)
    message = str(caught.value)
    assert "\n" not in message
    assert message.endswith(
        "the policies that export to LeRobot: act, diffusion, fastwam, pi0, pi05, smolvla"
    )
