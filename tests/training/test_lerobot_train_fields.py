"""Every field of lerobot-train 0.6.1's `TrainPipelineConfig` (read from LeRobot's own classes into
tests/fixtures/lerobot_train_fields/train_fields.json) is a flag `trainer train` accepts with LeRobot's
default, or refuses in one line naming it and why; none is unknown. The next LeRobot release is one
regenerated file. Then the flags honoured here, each doing what LeRobot's does."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import draccus
import pytest
import torch

from helpers.fixtures import copy_fixture, fixture_dir
from trainer.cli import main
from trainer.cli.lerobot_flags import EMPTY_MAP_IS_DEFAULT, NULL_IS_DEFAULT, RENAMED
from trainer.cli.parse import parse_config
from trainer.config.policy import PolicyConfig
from trainer.data.format.cameras import Cameras
from trainer.data.pipeline import loader
from trainer.data.pipeline.feed import DataFeed
from trainer.engine.plan import data_section, loop_section, resolve_optimization, set_cudnn
from trainer.errors import ConfigError

FIELDS = json.loads((fixture_dir("lerobot_train_fields") / "train_fields.json").read_text())["fields"]
BASE = ["--dataset.repo_id=local/x"]
# LeRobot's policy types built here: each takes every field of LeRobot's PreTrainedConfig
POLICY_TYPES = sorted(
    set(next(r for r in FIELDS if r["flag"] == "--policy")["choices"]) & set(PolicyConfig.get_known_choices())
)


# What a policy type needs typed beside LeRobot's defaults to be built offline: LeRobot's FastWAM starts
# from the Hub's `lerobot/fastwam_base` weights (`base_model_id`), which a run here takes as
# --policy.path instead and refuses in one line naming `--policy.base_model_id` (tests/training/test_fastwam_parity.py).
OFFLINE = {"fastwam": ["--policy.base_model_id=null"]}


def _typed_type(flag: str, choice: str) -> list[str]:
    """`--policy.type=<choice>` (or another choice flag) with what that type needs offline."""
    return [f"{flag}={choice}", *(OFFLINE.get(choice, []) if flag == "--policy.type" else [])]


def _cli(value: Any) -> str:
    """A default as typed on the command line (draccus's JSON form)."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    return json.dumps(value) if isinstance(value, dict | list) else str(value)


def _cases() -> list[tuple[str, list[str], Any]]:
    """(flag, the flags typed, LeRobot's default) for each row a value can be typed for: every choice
    of a choice type (`--env.type=aloha`, ...), and each optimizer's and scheduler's own fields."""
    cases = []
    for row in FIELDS:
        if row["kind"] == "group" or row["kind"] == "choice" or not row["draccus_flag"]:
            continue  # a group takes its fields; `--checkpoint_path` is no flag in LeRobot either
        if row["kind"] == "choice_type":
            cases += [(row["flag"], _typed_type(row["flag"], c), c) for c in row["choices"]]
        elif row["owner"] == "PreTrainedConfig":  # a policy base field: typed after each policy type
            typed = f"{row['flag']}={_cli(row['default'])}"
            cases += [
                (row["flag"], [*_typed_type("--policy.type", t), typed], row["default"]) for t in POLICY_TYPES
            ]
        elif row["default_kind"] == "value":
            cases.append((row["flag"], [f"{row['flag']}={_cli(row['default'])}"], row["default"]))
        for choice, fields in row.get("choice_fields", {}).items():
            typed = ["--use_policy_training_preset=false", f"{row['flag']}.type={choice}"]
            for f in fields:
                if f["default_kind"] == "value":
                    flag = f"{row['flag']}.{f['name']}"
                    cases.append((flag, [*typed, f"{flag}={_cli(f['default'])}"], f["default"]))
    return cases


def _parsed_value(config: Any, flag: str) -> tuple[bool, Any]:
    """(whether the config has the field, its value) for a dotted flag."""
    value = config
    for part in RENAMED.get(flag, flag)[2:].split("."):
        if not hasattr(value, part):
            return False, None
        value = getattr(value, part)
    return True, value


@pytest.mark.parametrize(
    ("flag", "typed", "default"), _cases(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_every_lerobot_train_flag_is_accepted_with_its_default_or_refused_in_one_line(
    flag: str, typed: list[str], default: Any
) -> None:
    try:
        config = parse_config([*BASE, *typed])
    except ConfigError as exc:
        message = str(exc)
        assert "\n" not in message and flag in message, message
        assert "unrecognized arguments" not in message, message
        return
    has_field, value = _parsed_value(config, flag)
    resolved = ("--output_dir", "--job_name", *NULL_IS_DEFAULT)  # their null: this trainer's default
    if flag in EMPTY_MAP_IS_DEFAULT:  # LeRobot's empty map: this trainer's default (the dataset's)
        assert default == {} and config == parse_config([*BASE, *typed[:-1]]), flag
    elif has_field and not (flag in resolved and default is None):
        assert draccus.encode(value) == default, (flag, value)


def test_the_walk_covers_the_flags_refused_as_unknown_before() -> None:
    walked = {flag for flag, _, _ in _cases()}
    assert len(FIELDS) == 108 and {"--env_eval_freq", "--eval.n_episodes", "--tolerance_s"} <= walked
    assert {"--policy.use_amp", "--policy.use_peft", "--policy.license"} <= walked
    assert POLICY_TYPES == ["act", "diffusion", "fastwam", "pi0", "pi05", "smolvla"]


def test_lerobots_smolvla_command_line_parses(tmp_path) -> None:
    """LeRobot's SmolVLA fine-tuning command (its docs), with --env_eval_freq=0 and a local dataset."""
    config = parse_config(
        [
            "--policy.type=smolvla",
            "--dataset.repo_id=lerobot/svla_so100_pickplace",
            f"--dataset.root={tmp_path}",
            "--batch_size=64",
            "--steps=20000",
            f"--output_dir={tmp_path / 'out'}",
            "--policy.device=auto",
            "--wandb.enable=false",
            "--env_eval_freq=0",
            "--eval.n_episodes=50",
            "--cudnn_deterministic=false",
        ]
    )
    assert (config.run_name, config.env_eval_freq) == ("smolvla", 0)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--env.type=libero"], "--env.type=libero: LeRobot's libero environment is not built here"),
        (["--env.fps=10"], "--env.fps needs --env.type=pusht|aloha|pendulum|gym first"),
        (["--eval.recording=true"], "--eval.recording: recording evaluation rollouts as a dataset"),
        (
            ["--keep_best=2"],
            "--keep_best=2 --best_metric=avg_sum_reward ranks checkpoints by an environment's",
        ),
        (["--job.target=a10g"], "--job.target=a10g: --job.* submits lerobot-train as a Hugging Face Job"),
        (["--reward_model.path=x/y"], "--reward_model.path=x/y: training a reward model is not built"),
        (["--save_checkpoint=false"], "--save_checkpoint=false is refused: trainer train always saves"),
        (["--eval_steps=5"], "--eval_steps=5 scores held-out episodes, and this run holds none out"),
        (
            ["--dataset.eval_split=0.2", "--eval_steps=5", "--eval_freq=4"],
            "--eval_steps=5 (LeRobot's name for --eval_freq) disagrees with --eval_freq=4",
        ),
        (["--dataloader_multiprocessing_context=thread"], "--dataloader_multiprocessing_context='thread'"),
        (["--tolerance_s=-1"], "--tolerance_s must be > 0 seconds, got -1.0"),
        (
            ["--policy.use_amp=true"],
            "--policy.use_amp=true is refused: autocast is --accelerator.mixed_precision",
        ),
        (
            ["--policy.use_peft=true"],
            "--policy.use_peft=true is refused: LeRobot sets it on a checkpoint saved",
        ),
        (["--policy.pretrained_path=x"], "--policy.pretrained_path=x is refused: lerobot-train sets it from"),
        (
            ["--policy.pretrained_revision=v1"],
            "--policy.pretrained_revision=v1 is refused: --policy.path downloads",
        ),
        (
            ['--policy.input_features={"observation.state": {"type": "STATE", "shape": [2]}}'],
            "is refused: name the features the policy reads as a list here",
        ),
        (
            ['--policy.output_features={"action": {}}'],
            "is refused: the action is the dataset's `action` feature",
        ),
    ],
)
def test_what_cannot_be_honoured_is_refused_in_one_line(flags: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)) as error:
        parse_config([*BASE, *flags])
    assert "\n" not in str(error.value)


def test_a_refusal_exits_non_zero_in_one_line_and_writes_nothing(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as info:
        main(["train", *BASE, f"--output_dir={out}", "--env.type=metaworld"])
    err = capsys.readouterr().err.strip()
    assert info.value.code != 0 and err.count("\n") == 0 and "aloha, gym, pendulum, pusht" in err
    assert not out.exists()


def test_tolerance_s_reaches_the_video_frames_and_only_a_lerobot_dataset(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"^--tolerance_s applies to a LeRobotDataset's video frames"):
        parse_config(["--dataset.type=pendulum", "--tolerance_s=0.001"])
    root = copy_fixture(tmp_path, "lerobot", "dataset_video")
    config = parse_config([f"--dataset.root={root}", "--tolerance_s=0.02"])
    assert config.dataset.tolerance_s == 0.02
    dataset = config.dataset.load(["observation.state", "observation.images.top"])
    reader = next(v for v in vars(dataset).values() if isinstance(v, Cameras))
    assert reader.tolerance == 0.02
    default = parse_config([f"--dataset.root={root}"]).dataset.load(["observation.images.top"])
    reader = next(v for v in vars(default).values() if isinstance(v, Cameras))
    assert reader.tolerance == pytest.approx(1 / reader.info.fps - 1e-4)  # unset: under one frame period


def test_eval_steps_and_max_eval_samples_are_the_held_out_val_loss(tmp_path) -> None:
    config = parse_config(
        [*BASE, "--dataset.eval_split=0.2", "--eval_steps=3", "--max_eval_samples=7", "--num_workers=0"]
    )
    section = data_section(config)
    assert (loop_section(config).val_freq, section.max_val_samples) == (3, 7)

    class HeldOut:
        weighted_order = None

        def __len__(self) -> int:
            return 40

    feed = DataFeed(section, HeldOut(), HeldOut(), 1, dp_world_size=1, rank=0, device=torch.device("cpu"))
    assert [(s.start, s.stop) for s in feed.held_out_spans()] == [(0, 7)]
    every = DataFeed(
        data_section(parse_config([*BASE, "--dataset.eval_split=0.2"])),
        HeldOut(),
        HeldOut(),
        1,
        dp_world_size=1,
        rank=0,
        device=torch.device("cpu"),
    )
    assert [(s.start, s.stop) for s in every.held_out_spans()] == [(0, 40)]


def test_loader_flags_reach_the_data_loader(monkeypatch) -> None:
    section = data_section(
        parse_config(
            [
                *BASE,
                "--persistent_workers=false",
                "--dataloader_multiprocessing_context=spawn",
                "--prefetch_factor=3",
            ]
        )
    )
    assert (section.persistent_workers, section.multiprocessing_context, section.prefetch_factor) == (
        False,
        "spawn",
        3,
    )
    seen: dict[str, Any] = {}

    class Stop(Exception):
        pass

    def data_loader(*args: Any, **kwargs: Any) -> None:
        seen.update(kwargs)
        raise Stop

    class Decoding:
        gather_in_workers = True

    monkeypatch.setattr(loader.torch.utils.data, "DataLoader", data_loader)
    settings = loader.LoaderSettings(1, 3, False, "spawn")
    with pytest.raises(Stop):
        next(loader.batches(Decoding(), None, range(1), 1, settings))  # type: ignore[arg-type]
    assert (seen["persistent_workers"], seen["multiprocessing_context"], seen["prefetch_factor"]) == (
        False,
        "spawn",
        3,
    )


def test_cudnn_deterministic_sets_cudnn_at_the_start(monkeypatch) -> None:
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", False)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    set_cudnn(False)
    assert (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark) == (False, True)
    set_cudnn(True)
    assert (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark) == (True, False)
    assert parse_config(["--cudnn_deterministic=true"]).cudnn_deterministic


def test_job_name_and_output_dir_follow_lerobots_defaults() -> None:
    assert parse_config(["--policy.type=mlp"]).run_name == "mlp"
    assert parse_config(["--policy.type=mlp", "--job_name=mine"]).run_name == "mine"
    config = parse_config(["--policy.type=mlp", "--output_dir=null"])
    assert re.search(r"outputs/train/\d{4}-\d\d-\d\d/\d\d-\d\d-\d\d_mlp$", config.output_dir)


def test_a_preset_field_is_refused_without_the_preset() -> None:
    config = parse_config(
        ["--policy.type=act", "--use_policy_training_preset=false", "--policy.optimizer_lr=1e-3"]
    )
    with pytest.raises(ConfigError, match=r"^--policy.optimizer_lr sets the policy's training preset, which"):
        resolve_optimization(config)
    backbone = [
        "--policy.type=act",
        "--use_policy_training_preset=false",
        "--policy.optimizer_lr_backbone=1e-3",
    ]
    assert resolve_optimization(parse_config(backbone))[0].lr == parse_config(backbone).optimizer.lr


def test_policy_input_features_as_a_list_still_parses() -> None:
    config = parse_config(["--policy.type=act", '--policy.input_features=["observation.state"]'])
    assert config.policy.input_features == ["observation.state"]


def test_lerobot_names_renamed_here() -> None:
    config = parse_config(["--peft.lora_alpha=8", "--wandb.mode=null", "--peft.init_type=null"])
    assert (config.peft.alpha, config.wandb.mode) == (8, "online")
    assert Path(parse_config([]).output_dir).name == "train"


def test_a_url_root_without_streaming_says_to_add_it() -> None:
    for root in ("s3://bucket/x", "hf://datasets/someone/data"):
        with pytest.raises(
            ConfigError, match=rf"^--dataset.root={root} is a URL, .*add --dataset.streaming=true"
        ):
            parse_config([f"--dataset.root={root}"])


def test_a_missing_local_root_says_it_is_missing(tmp_path) -> None:
    config = parse_config([f"--dataset.root={tmp_path / 'nowhere'}"])
    with pytest.raises(
        ConfigError, match=r"^--dataset.root=.*nowhere does not exist: pass the LeRobotDataset's"
    ):
        config.dataset.load()


def test_a_lerobot_checkpoint_of_a_type_we_lack_names_it_and_ours(tmp_path) -> None:
    step = copy_fixture(tmp_path, "lerobot", "checkpoint_act") / "checkpoints" / "000004"
    config_file = step / "pretrained_model" / "config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "type": "pi0_fast"}))
    with pytest.raises(
        ConfigError, match=r"holds a pi0_fast policy, a type this trainer does not have: it trains .*act, "
    ) as error:
        parse_config([f"--policy.path={step}"])
    assert "\n" not in str(error.value) and "smolvla" in str(error.value)


def test_a_malformed_stats_entry_is_refused_in_one_line(tmp_path) -> None:
    root = copy_fixture(tmp_path, "lerobot", "dataset_tiny")
    stats_file = root / "meta" / "stats.json"
    stats = json.loads(stats_file.read_text()) if stats_file.exists() else {}
    stats_file.write_text(json.dumps({**stats, "observation.state": "broken"}))
    with pytest.raises(
        ConfigError, match=r"stats.json: observation.state is 'broken', not an object of statistics"
    ) as error:
        parse_config([f"--dataset.root={root}"]).dataset.load()
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(("mode", "low", "high"), [("MIN_MAX", "min", "max"), ("QUANTILES", "q01", "q99")])
def test_smolvla_min_max_state_and_action_train_on_the_datasets_range(tmp_path, mode, low, high) -> None:
    """--policy.normalization_mapping's MIN_MAX or QUANTILES (recorded in config.json) is what the
    processors apply: stats.json's min/max (q01/q99) as the map onto [-1, 1], not the mean/std."""
    root = copy_fixture(tmp_path, "lerobot", "dataset_tiny")
    mapping = {"VISUAL": "IDENTITY", "STATE": mode, "ACTION": mode}
    config = parse_config(
        [
            f"--dataset.root={root}",
            "--policy.type=smolvla",
            f"--policy.normalization_mapping={json.dumps(mapping)}",
        ]
    )
    stats = config.dataset.load(["observation.state"]).stats()
    saved = json.loads((root / "meta" / "stats.json").read_text())["action"]
    assert stats["action"][low].tolist() == pytest.approx(saved[low])
    mapped = config.policy.normalization_stats(stats)
    for key in ("observation.state", "action"):
        bottom, top = stats[key][low], stats[key][high]
        assert torch.allclose(mapped[key]["mean"], (bottom + top) / 2)
        assert torch.allclose(mapped[key]["std"], (top - bottom) / 2)
    default = parse_config([f"--dataset.root={root}", "--policy.type=smolvla"]).policy
    assert default.normalization_stats(stats)["action"]["std"].equal(stats["action"]["std"])


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--policy.use_cache=false", "--policy.use_cache=false is not supported: the sampler always reuses"),
        (
            '--policy.normalization_mapping={"STATE": "QUANTILE10"}',
            "each mode must be one of MEAN_STD, MIN_MAX, QUANTILES, IDENTITY",
        ),
    ],
)
def test_smolvla_flags_it_cannot_honour_are_refused(flag: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_config(["--policy.type=smolvla", flag])
