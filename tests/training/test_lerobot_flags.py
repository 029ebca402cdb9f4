"""LeRobot's current `lerobot-train` flags: a LeRobot user's command runs unchanged on a local dataset,
and each newer flag either works (--dataset.revision, --dataset.eval_split, --rename_map,
--policy.device) or is refused with one line that says what to use instead."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from safetensors.torch import load_file

from helpers.fixtures import copy_fixture
from helpers.lerobot_data import STATE, VELOCITY, write_dataset
from helpers.run_outputs import model_file, saved_model
from helpers.train_flags import TINY_LEROBOT_ACT
from trainer.cli.eval_command import run_eval
from trainer.cli.parse import parse_config
from trainer.data.sources import hub
from trainer.data.sources.lerobot import LeRobotConfig
from trainer.engine.plan import check_policy_device, train
from trainer.errors import ConfigError
from trainer.policies.common.pretrained import policy_defaults

LENGTHS = [12, 15, 10, 14, 11, 13]  # episodes 0..5; tasks alternate "pick" (0, 2, 4) and "place"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("lerobot_flags") / "ds"
    write_dataset(path, LENGTHS, rows_per_file=25)
    meta = next((path / "meta" / "episodes").glob("chunk-*/file-*.parquet"))
    table = pq.read_table(meta)
    tasks = pa.array(
        [["pick"] if e % 2 == 0 else ["place"] for e in range(len(LENGTHS))], pa.list_(pa.string())
    )
    pq.write_table(table.set_column(table.column_names.index("tasks"), "tasks", tasks), meta)
    return path


def lerobot_command(
    root: Path, out: Path, *extra: str, policy: tuple[str, ...] = ("--policy.type=act", *TINY_LEROBOT_ACT)
) -> list[str]:
    """The command of LeRobot's docs, with flags that keep it tiny (ACT's sizes among them)."""
    return [
        "--dataset.repo_id=someone/my_dataset",
        f"--dataset.root={root}",
        *policy,
        "--policy.repo_id=someone/my_policy",
        f"--output_dir={out}",
        "--job_name=act_lerobot",
        "--steps=2",
        "--batch_size=4",
        "--save_freq=2",
        "--log_freq=1",
        *extra,
    ]


def test_a_lerobot_command_runs_unchanged(root, tmp_path, clean_accelerate, capsys) -> None:
    out = tmp_path / "run"
    summary = train(parse_config(lerobot_command(root, out, "--trackio.enable=true", "--policy.device=cpu")))
    err = capsys.readouterr().err
    assert "job act_lerobot: act policy" in err
    assert summary.last_checkpoint == str(out / "checkpoints" / "000002")
    saved = json.loads(model_file(out, 2, "train_config.json").read_text())
    assert saved["trackio"]["enable"] and saved["policy"]["device"] == "cpu"


def test_rename_map_renames_the_features_the_policy_reads_and_is_recorded(
    root, tmp_path, clean_accelerate, capsys
) -> None:
    out = tmp_path / "run"
    rename = {VELOCITY: "observation.speed", "observation.images.top": "observation.images.front"}
    train(
        parse_config(
            lerobot_command(root, out, f"--rename_map={json.dumps(rename)}", policy=("--policy.type=mlp",))
        )
    )
    model_dir = saved_model(out, 2)
    assert json.loads((model_dir / "config.json").read_text())["input_features"] == [
        STATE,
        "observation.speed",
    ]
    assert json.loads((model_dir / "train_config.json").read_text())["rename_map"] == rename
    assert (
        "--rename_map: observation.images.top is not among the observation features this run reads "
        f"({STATE}, {VELOCITY}): not renamed"
    ) in capsys.readouterr().err
    # `trainer eval` reads the run's own --rename_map: the renamed policy scores on the same data
    result = run_eval([f"--policy.path={out / 'checkpoints' / 'last'}"])
    assert (result["episodes"], result["frames"]) == (len(LENGTHS), sum(LENGTHS))


def test_rename_map_renames_a_camera_in_every_batch_and_its_statistics(tmp_path, clean_accelerate) -> None:
    """The camera policy asserts every camera arrives normalized (float32): a camera whose statistics
    kept the dataset's name would reach it as uint8. One loader worker: the wrapper pickles with it."""
    root = copy_fixture(tmp_path, "lerobot", "dataset_images")
    rename = {"observation.images.top": "observation.images.front"}
    flags = [f"--dataset.root={root}", "--policy.type=helpers.camera_policy:CameraPolicyConfig"]
    flags += [f"--rename_map={json.dumps(rename)}", "--num_workers=1", f"--output_dir={tmp_path / 'run'}"]
    flags += ["--steps=2", "--batch_size=4", "--save_freq=2", "--log_freq=1"]
    model_dir = Path(train(parse_config(flags)).last_checkpoint) / "pretrained_model"
    features = json.loads((model_dir / "config.json").read_text())["input_features"]
    assert features == [STATE, "observation.images.front", "observation.images.wrist"]
    saved_stats = load_file(model_dir / "policy_preprocessor_step_0.safetensors")
    assert "observation.images.front.mean" in saved_stats and not any("images.top" in k for k in saved_stats)


def test_eval_split_holds_out_a_fraction_of_each_tasks_episodes(root) -> None:
    config = LeRobotConfig(root=str(root), eval_split=0.34)  # 1 of each task's 3 episodes: its last
    held_out = config.load_validation()
    assert held_out.episode_bounds().shape[0] == 2
    train_set = config.load()
    assert len(held_out) == LENGTHS[4] + LENGTHS[5]
    assert len(train_set) == sum(LENGTHS[:4])
    chosen = LeRobotConfig(root=str(root), eval_split=0.5, episodes=[0, 1, 2, 3])  # of these only
    assert len(chosen.load_validation()) == LENGTHS[2] + LENGTHS[3]
    assert len(chosen.load()) == LENGTHS[0] + LENGTHS[1]


def test_revision_reaches_the_hub_download(monkeypatch) -> None:
    calls = []

    def snapshot_download(repo_id: str, **kwargs) -> str:
        calls.append((repo_id, kwargs["revision"]))
        return "/snapshot"

    monkeypatch.setattr("huggingface_hub.snapshot_download", snapshot_download)
    for name in ("TORCHELASTIC_USE_AGENT_STORE", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    hub.download_once.cache_clear()
    try:
        config = parse_config(["--dataset.repo_id=someone/data", "--dataset.revision=v3.0"])
        assert str(config.dataset.local_root()) == "/snapshot"
    finally:
        hub.download_once.cache_clear()
    assert calls == [("someone/data", "v3.0")]


def test_policy_device_must_agree_with_the_launch() -> None:
    for device in (None, "auto", "cpu"):
        check_policy_device(device, cuda=False)
    check_policy_device("cuda", cuda=True)
    with pytest.raises(
        ConfigError, match=r"--policy.device=cuda disagrees with this launch, which trains on cpu"
    ):
        check_policy_device("cuda", cuda=False)
    with pytest.raises(ConfigError, match=r"--policy.device=cpu .* trains on cuda: torch sees a GPU"):
        check_policy_device("cpu", cuda=True)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--save_checkpoint_to_hub=true"], "--save_checkpoint_to_hub=true needs the Hub repo"),
        (["--ema.enable=true", "--ema.decay=1.5"], "--ema.decay must be in (0, 1), got 1.5"),
        (
            ["--dataset.root=x", "--dataset.eval_split=0.2", "--dataset.val_episodes=[1]"],
            "--dataset.eval_split and --dataset.val_episodes both choose",
        ),
        (["--dataset.root=x", "--dataset.eval_split=1.5"], "--dataset.eval_split must be in [0, 1), got 1.5"),
        (["--policy.device=tpu"], "--policy.device='tpu' is not one of auto, cpu, cuda, mps"),
    ],
)
def test_unsupported_or_bad_lerobot_flags_are_one_line(flags: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)) as error:
        parse_config(flags)
    assert "\n" not in str(error.value)


def test_accepted_lerobot_flags_parse() -> None:
    config = parse_config(["--ema.decay=0.99", "--save_checkpoint_to_hub=false", "--policy.device=auto"])
    assert (config.ema.decay, config.save_checkpoint_to_hub, config.policy.device) == (0.99, False, "auto")


def test_a_lerobot_base_policys_device_and_repo_are_not_inherited(tmp_path) -> None:
    """LeRobot's config.json records the device it trained on and its Hub repo: a fine-tune with
    --policy.path chooses its own device (a base trained on cuda still fine-tunes on a CPU machine) and
    never publishes over the base's repo unless told to."""
    step = copy_fixture(tmp_path, "lerobot", "checkpoint_act") / "checkpoints" / "000004"
    config_file = step / "pretrained_model" / "config.json"
    saved = json.loads(config_file.read_text())
    config_file.write_text(
        json.dumps({**saved, "device": "cuda", "push_to_hub": True, "repo_id": "them/base"})
    )
    with policy_defaults([f"--policy.path={step}"], None) as merged:
        assert merged is not None
        policy = json.loads(Path(merged).read_text())["policy"]
    assert not {"device", "push_to_hub", "repo_id", "private"} & set(policy)
    assert policy["type"] == saved["type"] and policy["path"] == str(step)
