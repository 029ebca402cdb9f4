"""SmolVLA through the engine: trained from scratch on LeRobot's camera dataset with the task text,
saved in LeRobot's layout (its config.json schema and tensor names), fine-tuned from LeRobot's own
checkpoint with --policy.path, and the bad inputs refused in one line before the model is built."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

import trainer
from helpers.engine_run import TINY_SMOLVLA, rewound_copy
from helpers.fixtures import copy_fixture
from helpers.run_outputs import metrics, model_file, saved_model
from trainer.cli.parse import parse_config
from trainer.engine.plan import train
from trainer.errors import ConfigError

TINY = TINY_SMOLVLA


# The schedule of the fixture's lerobot-train command (its train_log.txt), 4 steps.
LEROBOT_SCHEDULE = [
    "--policy.optimizer_lr=1e-3",
    "--policy.scheduler_warmup_steps=1",
    "--policy.scheduler_decay_steps=4",
    "--steps=4",
]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder as LeRobot's fixture was made in: the backbone as `tiny_smolvlm/`, the dataset, and
    LeRobot's checkpoint."""
    tmp = tmp_path_factory.mktemp("smolvla_engine")
    fixture = copy_fixture(tmp, "lerobot_smolvla_tiny")
    shutil.copytree(fixture / "tiny_smolvlm", tmp / "tiny_smolvlm")
    copy_fixture(tmp, "lerobot", "dataset_video")
    return tmp


@pytest.fixture(scope="module")
def trained(workdir: Path) -> Path:
    from accelerate.state import AcceleratorState

    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(workdir)
        AcceleratorState._reset_state(reset_partial_state=True)
        train(
            parse_config([*TINY, *LEROBOT_SCHEDULE, "--dataset.root=dataset_video", "--output_dir=scratch"])
        )
        AcceleratorState._reset_state(reset_partial_state=True)
    return workdir / "scratch" / "checkpoints" / "last"


def _shapes(path: Path) -> dict[str, list[int]]:
    with safe_open(str(path), "pt") as handle:
        return {key: list(handle.get_slice(key).get_shape()) for key in handle.keys()}  # noqa: SIM118


def test_saved_weights_and_config_are_lerobots_schema(trained: Path, workdir: Path) -> None:
    ours, lerobot = trained / "pretrained_model", workdir / "lerobot_smolvla_tiny" / "pretrained_model"
    assert _shapes(ours / "model.safetensors") == _shapes(lerobot / "model.safetensors")
    config, theirs = (json.loads((d / "config.json").read_text()) for d in (ours, lerobot))
    assert sorted(config) == sorted(theirs)  # LeRobot's draccus refuses any other field
    assert config["input_features"] == theirs["input_features"]
    assert config["output_features"] == theirs["output_features"]


def test_the_training_preset_follows_lerobots_learning_rates(trained: Path, workdir: Path) -> None:
    """SmolVLA's preset (AdamW, cosine decay with warmup from the optimizer_*/scheduler_* fields)
    gives the rates lerobot-train logged for the same command, as it prints them."""
    records = metrics(workdir / "scratch")
    ours = [f"{r['lr']:.1e}" for r in records if r.get("event") == "train"]
    log = (workdir / "lerobot_smolvla_tiny" / "train_log.txt").read_text().split()
    assert ours == [field.removeprefix("lr:") for field in log if field.startswith("lr:")]


def test_our_checkpoint_acts_on_a_raw_observation_with_its_task(
    trained: Path, workdir: Path, tmp_path: Path, monkeypatch
) -> None:
    """From any working directory: the run was given `--policy.vlm_model_name=tiny_smolvlm` relative to
    its own, and its checkpoint names the backbone absolute."""
    saved = json.loads((trained / "pretrained_model" / "train_config.json").read_text())["policy"]
    assert saved["vlm_model_name"] == str(workdir / "tiny_smolvlm")
    monkeypatch.chdir(tmp_path)
    loaded = trainer.load_policy(str(trained))
    frame = torch.zeros(24, 40, 3, dtype=torch.uint8).numpy()
    observation = {
        "observation.state": [0.1, 0.2, 0.0, 0.0],
        "observation.images.top": frame,
        "observation.images.wrist": frame,
        "task": "reach the corner the colour names",
    }
    torch.manual_seed(0)
    first = loaded.select_action(observation)
    assert first.shape == (2,) and torch.isfinite(first).all()
    rest = [loaded.select_action(observation) for _ in range(4)]  # served from the action queue
    torch.manual_seed(0)
    chunk = loaded.policy.predict_action_chunk(loaded.preprocessor(_raw(observation)))
    expected = loaded.postprocessor({"action": chunk})["action"][0]
    torch.testing.assert_close(torch.stack([first, *rest]), expected)


def _raw(observation: dict) -> dict[str, torch.Tensor]:
    from trainer.data.pipeline.processors import observation_batch

    batch, _ = observation_batch(
        observation, ["observation.state", "observation.images.top", "observation.images.wrist", "task"]
    )
    return batch


def test_lerobots_checkpoint_fine_tunes_here(workdir: Path, monkeypatch) -> None:
    """--policy.path=<LeRobot's pretrained_model>: its config and weights, trained on for a step."""
    from accelerate.state import AcceleratorState

    monkeypatch.chdir(workdir)
    base = workdir / "lerobot_smolvla_tiny" / "pretrained_model"
    AcceleratorState._reset_state(reset_partial_state=True)
    flags = [f"--policy.path={base}", "--dataset.root=dataset_video", "--batch_size=2", "--num_workers=0"]
    train(parse_config([*flags, "--steps=1", "--output_dir=tuned"]))
    AcceleratorState._reset_state(reset_partial_state=True)
    step = saved_model(workdir / "tuned")
    with (
        safe_open(str(step / "model.safetensors"), "pt") as ours,
        safe_open(str(base / "model.safetensors"), "pt") as theirs,
    ):
        frozen = "model.vlm_with_expert.vlm.model.text_model.layers.0.self_attn.q_proj.weight"
        trained_ = "model.vlm_with_expert.lm_expert.layers.0.self_attn.q_proj.weight"
        assert torch.equal(ours.get_tensor(frozen), theirs.get_tensor(frozen))  # train_expert_only
        assert not torch.equal(ours.get_tensor(trained_), theirs.get_tensor(trained_))


def test_a_resumed_run_is_bit_exact(workdir: Path, monkeypatch) -> None:
    """3 steps straight equal the same run resumed from its step 2 (the flow-matching noise and time
    come from the restored RNG, the schedule from the saved scheduler)."""
    from accelerate.state import AcceleratorState

    monkeypatch.chdir(workdir)
    flags = [*TINY, "--dataset.root=dataset_video", "--steps=3", "--save_freq=2", "--output_dir=straight"]
    AcceleratorState._reset_state(reset_partial_state=True)
    train(parse_config(flags))
    rewound_copy(workdir / "straight", workdir / "resumed", 2)
    AcceleratorState._reset_state(reset_partial_state=True)
    train(parse_config(["--resume=true", "--steps=3", "--output_dir=resumed"]))
    AcceleratorState._reset_state(reset_partial_state=True)
    weights = [model_file(workdir / run, 3) for run in ("straight", "resumed")]
    with safe_open(str(weights[0]), "pt") as straight, safe_open(str(weights[1]), "pt") as resumed:
        assert all(torch.equal(straight.get_tensor(k), resumed.get_tensor(k)) for k in straight.keys())  # noqa: SIM118


def test_checkpointed_units_and_ema_train_the_plain_runs_weights(workdir: Path, monkeypatch, capsys) -> None:
    """Activation checkpointing per unit (the vision layers, the MLPs, every projection, recomputed in
    backward) changes no number, and EMA keeps its shadow beside the trained weights: 2 steps with both
    save the plain run's model.safetensors bit for bit, plus an ema.safetensors that differs from it."""
    from accelerate.state import AcceleratorState

    monkeypatch.chdir(workdir)
    extra = {
        "plain": [],
        "checkpointed": ["--accelerator.activation_checkpointing=true", "--ema.enable=true"],
    }
    for run, flags in extra.items():
        AcceleratorState._reset_state(reset_partial_state=True)
        train(
            parse_config([*TINY, "--dataset.root=dataset_video", "--steps=2", f"--output_dir={run}", *flags])
        )
    AcceleratorState._reset_state(reset_partial_state=True)
    banner = capsys.readouterr().err
    assert (
        "activation checkpointing: " in banner
        and "(by class: SmolVLMEncoderLayer, LlamaMLP, Linear, Embedding)" in banner
    )
    saved = {run: saved_model(workdir / run) for run in extra}
    plain, checkpointed = (load_file(str(saved[run] / "model.safetensors")) for run in extra)
    assert plain.keys() == checkpointed.keys()
    assert all(torch.equal(plain[name], checkpointed[name]) for name in plain)
    ema = load_file(str(saved["checkpointed"] / "ema.safetensors"))
    trained = [name for name in ema if not torch.equal(ema[name], checkpointed[name])]
    assert trained and set(ema) <= set(checkpointed)


# ------------------------------------------------------------------ bad inputs, one line each


def _refused(workdir: Path, monkeypatch, flags: list[str]) -> str:
    monkeypatch.chdir(workdir)
    with pytest.raises(ConfigError) as error:
        train(parse_config([*TINY, "--dataset.root=dataset_video", "--steps=1", "--output_dir=bad", *flags]))
    message = str(error.value)
    assert "\n" not in message
    return message


def test_a_backbone_without_a_tokenizer_is_one_line(workdir: Path, monkeypatch) -> None:
    bare = workdir / "bare_smolvlm"
    bare.mkdir(exist_ok=True)
    shutil.copy(workdir / "tiny_smolvlm" / "config.json", bare / "config.json")
    message = _refused(workdir, monkeypatch, ["--policy.vlm_model_name=bare_smolvlm"])
    assert message.startswith(f"--policy.vlm_model_name={bare}: {bare} holds no tokenizer")  # absolute


def test_a_missing_backbone_is_one_line(workdir: Path, monkeypatch) -> None:
    message = _refused(workdir, monkeypatch, ["--policy.vlm_model_name=./nowhere"])
    assert message.startswith("--policy.vlm_model_name=./nowhere: no such directory")


def test_a_state_wider_than_max_state_dim_is_one_line(workdir: Path, monkeypatch) -> None:
    message = _refused(workdir, monkeypatch, ["--policy.max_state_dim=3"])
    assert message.startswith("the state has 4 values, more than --policy.max_state_dim=3")


def test_more_cameras_than_the_checkpoint_is_one_line(workdir: Path, monkeypatch) -> None:
    base = workdir / "one_camera"
    if not base.exists():
        shutil.copytree(workdir / "lerobot_smolvla_tiny" / "pretrained_model", base)
        config = json.loads((base / "config.json").read_text())
        del config["input_features"]["observation.images.wrist"]
        (base / "config.json").write_text(json.dumps(config))
    every_camera = "--policy.input_features=[observation.state,observation.images.*,task]"
    message = _refused(workdir, monkeypatch, [f"--policy.path={base}", every_camera])
    assert "observation.images.wrist" in message and "not trained with" in message


def test_a_path_whose_backbone_differs_from_the_flag_is_one_line(workdir: Path, monkeypatch) -> None:
    base = workdir / "lerobot_smolvla_tiny" / "pretrained_model"
    other = workdir / "other_smolvlm"
    if not other.exists():  # the same shapes, another model: only the backbone check can see it
        shutil.copytree(workdir / "tiny_smolvlm", other)
        config = json.loads((other / "config.json").read_text())
        config["text_config"]["rms_norm_eps"] = 1e-6
        (other / "config.json").write_text(json.dumps(config))
    message = _refused(
        workdir, monkeypatch, [f"--policy.path={base}", "--policy.vlm_model_name=other_smolvlm"]
    )
    assert message.startswith(
        f"--policy.vlm_model_name=other_smolvlm but --policy.path={base} was trained on tiny_smolvlm"
    )
