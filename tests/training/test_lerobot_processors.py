"""Our processor files are LeRobot 0.6.1's pipeline schema: an ACT trained here on LeRobot's
`dataset_tiny` and a SmolVLA on `dataset_video` write `policy_preprocessor.json` /
`policy_postprocessor.json` equal, field by field, to those lerobot-train wrote for the same policy and
dataset (tests/fixtures/lerobot/checkpoint_act, tests/fixtures/lerobot_smolvla_tiny), with state files
of LeRobot's names holding, under its tensor names, shapes and dtypes, the statistics its normalizer
reads; read back, ours normalize as LeRobot's do."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import ckpt_tools
import trainer
from helpers.fixtures import copy_fixture, fixture_dir
from helpers.processor_files import same_as_lerobots
from helpers.run_outputs import saved_model
from trainer.cli.parse import parse_config
from trainer.data.pipeline.processors import Processor
from trainer.engine.plan import train
from trainer.evaluation.lerobot_export import export_lerobot

ACT = ["--policy.type=act", "--policy.dim_model=16", "--policy.n_heads=2", "--policy.dim_feedforward=32",
       "--policy.n_encoder_layers=1", "--policy.n_vae_encoder_layers=1", "--policy.latent_dim=4",
       "--policy.chunk_size=4", "--policy.n_action_steps=4", "--policy.pretrained_backbone_weights=null",
       "--policy.input_features=[observation.state,observation.environment_state]",
       "--policy.env_state_dim=3"]  # fmt: skip
SMOLVLA = ["--policy.type=smolvla", "--policy.vlm_model_name=tiny_smolvlm", "--policy.load_vlm_weights=false",
           "--policy.chunk_size=5", "--policy.n_action_steps=5", "--policy.num_vlm_layers=4",
           "--policy.num_steps=3", "--policy.resize_imgs_with_padding=[32,32]"]  # fmt: skip
COMMON = ["--batch_size=2", "--num_workers=0", "--steps=1"]
LEROBOT_ACT = fixture_dir("lerobot", "checkpoint_act", "checkpoints", "000004", "pretrained_model")
LEROBOT_SMOLVLA = fixture_dir("lerobot_smolvla_tiny", "pretrained_model")


def _train(work: Path, dataset: str, flags: list[str]) -> Path:
    from accelerate.state import AcceleratorState

    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(work)  # the SmolVLA backbone `tiny_smolvlm` resolves here, as in LeRobot's run
        AcceleratorState._reset_state(reset_partial_state=True)
        train(parse_config([*flags, *COMMON, f"--dataset.root={dataset}", f"--output_dir={work / 'run'}"]))
        AcceleratorState._reset_state(reset_partial_state=True)
    return saved_model(work / "run")


@pytest.fixture(scope="module")
def act_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("act_processors")
    copy_fixture(work, "lerobot", "dataset_tiny")
    return _train(work, "dataset_tiny", ACT)


@pytest.fixture(scope="module")
def smolvla_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("smolvla_processors")
    shutil.copytree(fixture_dir("lerobot_smolvla_tiny", "tiny_smolvlm"), work / "tiny_smolvlm")
    copy_fixture(work, "lerobot", "dataset_video")
    return _train(work, "dataset_video", SMOLVLA)


def _normalizers(model: Path) -> list[Processor]:
    processors = ckpt_tools.load_processors(str(model))
    return [Processor.from_state(p.config, p.step_tensors) for p in processors.values()]


def test_an_act_writes_lerobots_processor_files(act_model: Path) -> None:
    same_as_lerobots(act_model, LEROBOT_ACT)
    ours = load_file(str(act_model / "policy_preprocessor_step_3_normalizer_processor.safetensors"))
    theirs = load_file(str(LEROBOT_ACT / "policy_preprocessor_step_3_normalizer_processor.safetensors"))
    assert all(torch.allclose(ours[key], theirs[key]) for key in ours)  # the same stats.json, read twice


def test_the_acts_files_read_back_normalize_as_lerobots(act_model: Path) -> None:
    """The environment state (the last 3 of our 7 state values) left as it is, as LeRobot's ACT does."""
    batch = {"observation.state": torch.randn(5, 7), "action": torch.randn(5, 2)}
    for mine, lerobots in zip(_normalizers(act_model), _normalizers(LEROBOT_ACT), strict=True):
        for key, value in mine(batch).items():
            assert torch.allclose(value, lerobots(batch)[key], atol=1e-6), key
    assert torch.equal(
        _normalizers(act_model)[0](batch)["observation.state"][:, 4:], batch["observation.state"][:, 4:]
    )


def test_a_smolvla_writes_lerobots_processor_files(smolvla_model: Path) -> None:
    """LeRobot's files, but for the tokenizer's name: the run was given the backbone `tiny_smolvlm`
    relative to its directory, as LeRobot's was, and records it absolute (any directory reads it)."""
    same_as_lerobots(smolvla_model, LEROBOT_SMOLVLA, backbone=smolvla_model.parents[3] / "tiny_smolvlm")
    names = sorted(p.name for p in smolvla_model.glob("policy_*processor*"))
    assert names == sorted(p.name for p in LEROBOT_SMOLVLA.glob("policy_*processor*"))


def test_an_act_trains_with_the_environment_state_unnormalized_as_lerobots() -> None:
    """What the files say is what training did: the file has no ENV mode, so the run's own processors
    must leave the environment state as it is too."""
    from trainer.policies.act import ACTConfig

    config = ACTConfig(obs_dim=7, action_dim=2, env_state_dim=3, input_features=["a", "b"])
    stats = {"observation.state": {"mean": torch.full((7,), 2.0), "std": torch.full((7,), 3.0)}}
    state = config.normalization_stats(stats)["observation.state"]
    assert state["mean"].tolist() == [2.0] * 4 + [0.0] * 3 and state["std"].tolist() == [3.0] * 4 + [1.0] * 3
    assert stats["observation.state"]["mean"].tolist() == [2.0] * 7  # the dataset's own left alone


def test_an_older_checkpoints_processors_are_exported_in_lerobots_schema(act_model: Path, tmp_path) -> None:
    """A checkpoint whose processor files are the schema before (steps-v1) exports LeRobot's: the same
    files an ACT saved now holds."""
    older = tmp_path / "older"
    shutil.copytree(act_model, older, ignore=shutil.ignore_patterns("policy_*"))
    loaded = trainer.load_policy(str(act_model))
    for name, processor in (
        ("policy_preprocessor", loaded.preprocessor),
        ("policy_postprocessor", loaded.postprocessor),
    ):
        config, tensors = Processor(processor.steps).state()
        assert config["steps"][0]["type"] in ("normalize", "unnormalize")
        (older / f"{name}.json").write_text(json.dumps(config))
        save_file(tensors[0], str(older / f"{name}_step_0.safetensors"))
    export_lerobot(str(older), str(tmp_path / "export"))
    for name in ("policy_preprocessor.json", "policy_postprocessor.json"):
        assert json.loads((tmp_path / "export" / name).read_text()) == json.loads(
            (act_model / name).read_text()
        )
    for file in act_model.glob("policy_*.safetensors"):
        mine, theirs = load_file(str(tmp_path / "export" / file.name)), load_file(str(file))
        assert mine.keys() == theirs.keys() and all(torch.allclose(mine[k], theirs[k]) for k in mine)


def test_statistics_a_lerobot_pipeline_would_not_apply_are_refused() -> None:
    """An IDENTITY feature normalized by ours (an older ACT's environment state) cannot be written as
    LeRobot's: one line rather than a file that acts otherwise in LeRobot."""
    from trainer.data.pipeline.lerobot_schema import LeRobotPipeline
    from trainer.errors import ConfigError

    features = {
        "observation.state": {"type": "STATE", "shape": [2]},
        "action": {"type": "ACTION", "shape": [1]},
    }
    pipeline = LeRobotPipeline((), features, {"STATE": "IDENTITY", "ACTION": "MEAN_STD"})
    ones = {"mean": torch.zeros(2), "std": torch.ones(2)}
    action = {"mean": torch.zeros(1), "std": torch.ones(1)}
    assert pipeline.preprocessor({"observation.state": ones, "action": action})[1][0].keys() == {
        "action.mean",
        "action.std",
    }
    with pytest.raises(ConfigError, match=r"observation\.state is normalized by these statistics"):
        pipeline.preprocessor({"observation.state": {**ones, "std": torch.full((2,), 2.0)}, "action": action})
