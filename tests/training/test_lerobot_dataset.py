"""LeRobotDataset v3.0 input: the frames, episode boundaries, statistics, the fixture written by LeRobot
itself, and one-line errors for every bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file

from helpers.fixtures import copy_fixture
from helpers.lerobot_data import IMAGE, STATE, VELOCITY, write_dataset
from helpers.run_outputs import metrics
from trainer.cli.parse import parse_config
from trainer.config.train import encode_config
from trainer.data.sources.lerobot import LeRobotConfig
from trainer.engine.plan import train
from trainer.errors import ConfigError

LENGTHS = [30, 45, 20, 52, 33]


@pytest.fixture(scope="module")
def dataset_root(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    root = tmp_path_factory.mktemp("lerobot") / "ds"
    return root, write_dataset(root, LENGTHS, rows_per_file=37)


def test_frames_of_chosen_episodes_across_files(dataset_root) -> None:
    root, data = dataset_root
    assert len(list(root.glob("data/chunk-*/file-*.parquet"))) == 5  # episodes span files and chunks
    dataset = LeRobotConfig(root=str(root), episodes=[3, 1]).load()
    rows = np.flatnonzero(np.isin(data["episode_index"], [1, 3]))
    expected = np.concatenate([data[STATE][rows], data[VELOCITY][rows]], axis=1)
    assert torch.equal(dataset.observations, torch.from_numpy(expected))  # info.json order: state, velocity
    assert torch.equal(dataset.actions, torch.from_numpy(data["action"][rows]))
    assert dataset.input_features == [STATE, VELOCITY] and dataset.obs_dim == 6
    assert dataset.episode_bounds().tolist() == [[0, 45], [45, 97]]


def test_action_chunks_stop_at_episode_boundaries(dataset_root) -> None:
    root, data = dataset_root
    dataset = LeRobotConfig(root=str(root)).load()
    first_end = LENGTHS[0] - 1
    batch = dataset.gather(torch.tensor([first_end - 1, first_end, first_end + 1]), 3)
    assert batch["action_is_pad"].tolist() == [[False, False, True], [False, True, True], [False] * 3]
    assert torch.equal(batch["action"][1], torch.from_numpy(data["action"][[first_end] * 3]))


def test_statistics_come_from_stats_json(dataset_root) -> None:
    root, _ = dataset_root
    stats = json.loads((root / "meta/stats.json").read_text())
    stats[STATE]["mean"] = [10.0, 20.0, 30.0, 40.0]  # not what the frames give: the file must win
    shifted = root.parent / "shifted"
    shutil.copytree(root, shifted)
    (shifted / "meta/stats.json").write_text(json.dumps(stats))
    loaded = LeRobotConfig(root=str(shifted), episodes=[0]).load().stats()
    assert loaded["observation.state"]["mean"][:4].tolist() == [10.0, 20.0, 30.0, 40.0]
    assert torch.allclose(loaded["observation.state"]["std"][4:], torch.tensor(stats[VELOCITY]["std"]))
    assert torch.allclose(loaded["action"]["mean"], torch.tensor(stats["action"]["mean"]))


def test_only_used_columns_are_read_never_the_image(dataset_root, monkeypatch) -> None:
    root, _ = dataset_root
    read_columns: list[tuple[str, ...]] = []
    original = pq.ParquetFile.read

    def spy(self, columns=None, **kwargs):
        read_columns.append(tuple(columns or ("<all>",)))
        return original(self, columns=columns, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read", spy)
    LeRobotConfig(root=str(root), episodes=[1]).load(input_features=[VELOCITY])
    used = {column for call in read_columns for column in call}
    assert used == {"episode_index", "dataset_from_index", "dataset_to_index", "index", VELOCITY, "action"}
    assert ("index",) in read_columns and IMAGE not in used and "<all>" not in used
    feature_reads = [call for call in read_columns if VELOCITY in call]
    assert len(feature_reads) == 3  # episode 1 (frames 30..74) spans the first three of five files


def test_reads_the_dataset_lerobot_wrote(tmp_path) -> None:
    root = copy_fixture(tmp_path, "lerobot", "dataset_tiny")
    dataset = LeRobotConfig(root=str(root)).load()
    table = pq.read_table(root / "data/chunk-000/file-000.parquet")
    state = np.asarray(table.column("observation.state").to_pylist(), dtype=np.float32)
    env = np.asarray(table.column("observation.environment_state").to_pylist(), dtype=np.float32)
    assert torch.equal(dataset.observations, torch.from_numpy(np.concatenate([state, env], axis=1)))
    assert dataset.episode_bounds().tolist() == [[0, 20], [20, 40]]
    stats = json.loads((root / "meta/stats.json").read_text())
    assert dataset.stats()["action"]["mean"].tolist() == pytest.approx(stats["action"]["mean"])


def test_lerobot_flags_imply_the_type_and_the_saved_config_records_it(dataset_root, tmp_path) -> None:
    root, _ = dataset_root
    config = parse_config(
        ["--dataset.repo_id=me/data", f"--dataset.root={root}", "--dataset.val_episodes=[4]"]
    )
    assert isinstance(config.dataset, LeRobotConfig)
    saved = encode_config(config)
    assert saved["dataset"]["type"] == "lerobot" and saved["dataset"]["val_episodes"] == [4]
    path = tmp_path / "train_config.json"
    path.write_text(json.dumps(saved))
    again = parse_config([f"--config_path={path}", "--dataset.episodes=[0,1]"])
    assert isinstance(again.dataset, LeRobotConfig) and again.dataset.episodes == [0, 1]


def _truncate(root: Path) -> None:
    path = root / "data/chunk-000/file-001.parquet"
    path.write_bytes(path.read_bytes()[:200])


def _downgrade(root: Path) -> None:
    info = json.loads((root / "meta/info.json").read_text())
    (root / "meta/info.json").write_text(json.dumps({**info, "codebase_version": "v2.1"}))


@pytest.mark.parametrize(
    ("damage", "kwargs", "match"),
    [
        (
            lambda r: (r / "meta/info.json").unlink(),
            {},
            r"has no meta/info.json, so it is not a LeRobotDataset",
        ),
        (_downgrade, {}, r"is a LeRobotDataset v2.1; the trainer reads v3.0: convert it with LeRobot's"),
        (_truncate, {}, r"file-001.parquet is not a readable parquet file .* truncated or damaged"),
        (
            None,
            {"episodes": [2, 9]},
            r"--dataset.episodes names episode 9, but the dataset holds episodes 0..4",
        ),
        (None, {"val_episodes": [7]}, r"--dataset.val_episodes names episode 7"),
        (
            None,
            {"features": ["observation.nope"]},
            r"names 'observation.nope', which the dataset at .* does not",
        ),
        (None, {"features": ["task_index"]}, r"names 'task_index', which the dataset at .* does not"),
    ],
)
def test_bad_inputs_are_one_line_errors(dataset_root, tmp_path, damage, kwargs, match) -> None:
    root = tmp_path / "ds"
    shutil.copytree(dataset_root[0], root)
    if damage is not None:
        damage(root)
    features = kwargs.pop("features", ())
    config = LeRobotConfig(root=str(root), **kwargs)
    with pytest.raises(ConfigError, match=match) as info:
        config.load(features)
        config.load_validation(features)
    assert "\n" not in str(info.value)


def test_overlapping_train_and_val_episodes_are_refused() -> None:
    with pytest.raises(
        ConfigError, match=r"episodes \[2\] are in both --dataset.episodes and --dataset.val_episodes"
    ):
        parse_config(["--dataset.root=/x", "--dataset.episodes=[1,2]", "--dataset.val_episodes=[2,3]"])


def test_repo_id_offline_without_cache_names_the_root_flag(monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    with pytest.raises(
        ConfigError, match=r"--dataset.repo_id=nobody/missing: no local copy .* --dataset.root=PATH"
    ):
        LeRobotConfig(repo_id="nobody/missing").load()


def test_training_logs_falling_val_loss_and_records_the_inputs(
    dataset_root, tmp_path, clean_accelerate, capsys
) -> None:
    root, _ = dataset_root
    out = tmp_path / "run"
    args = [
        f"--dataset.root={root}",
        "--dataset.val_episodes=[2]",
        "--policy.type=mlp",
        "--policy.hidden_dim=32",
        "--policy.dropout=0",
        "--steps=30",
        "--eval_freq=10",
        "--use_policy_training_preset=false",
        "--scheduler.warmup_steps=0",
        "--optimizer.lr=1e-2",  # falls clearly within 30 steps whatever the initial draw
        "--log_freq=10",
        "--save_freq=30",
        "--batch_size=16",
        f"--output_dir={out}",
    ]
    summary = train(parse_config(args))
    records = metrics(out)
    val = [(r["step"], r["val_loss"]) for r in records if r.get("event") == "val"]
    assert [step for step, _ in val] == [10, 20, 30] and val[-1][1] < 0.8 * val[0][1]
    banner = next(r["banner"] for r in records if r.get("event") == "start")
    assert any("cameras: observation.images.front (image)" in line for line in banner)
    assert any("held out for val_loss: 20 frames in 1 episodes" in line for line in banner)
    assert "val_loss=" in capsys.readouterr().err
    saved = json.loads((Path(summary.last_checkpoint) / "pretrained_model" / "config.json").read_text())
    assert saved["input_features"] == [STATE, VELOCITY] and saved["obs_dim"] == 6


def test_frames_come_in_index_order_whatever_the_file_order(dataset_root, tmp_path) -> None:
    root = tmp_path / "ds"
    shutil.copytree(dataset_root[0], root)
    first, second = root / "data/chunk-000/file-000.parquet", root / "data/chunk-000/file-001.parquet"
    first_bytes = first.read_bytes()
    first.write_bytes(second.read_bytes())
    second.write_bytes(first_bytes)  # file-000 now holds frames 37..73, file-001 frames 0..36
    swapped = LeRobotConfig(root=str(root), episodes=[0, 1]).load()
    original = LeRobotConfig(root=str(dataset_root[0]), episodes=[0, 1]).load()
    assert torch.equal(swapped.observations, original.observations)
    assert torch.equal(swapped.actions, original.actions)


def test_resume_on_a_lerobot_dataset_is_sample_exact(dataset_root, tmp_path, clean_accelerate) -> None:
    from accelerate.state import AcceleratorState

    root, _ = dataset_root
    flags = [f"--dataset.root={root}", "--dataset.val_episodes=[4]", "--policy.dropout=0", "--policy.dim=16"]
    flags += [
        "--policy.ffn_dim=32",
        "--use_policy_training_preset=false",
        "--scheduler.type=constant",
        "--batch_size=16",
        "--save_freq=4",
        "--log_freq=4",
    ]
    straight = train(parse_config([*flags, "--steps=8", f"--output_dir={tmp_path / 'a'}"]))
    AcceleratorState._reset_state(reset_partial_state=True)
    train(parse_config([*flags, "--steps=4", f"--output_dir={tmp_path / 'b'}"]))
    AcceleratorState._reset_state(reset_partial_state=True)
    resumed = train(parse_config(["--resume=true", "--steps=8", f"--output_dir={tmp_path / 'b'}"]))
    weights = [
        load_file(Path(s.last_checkpoint) / "pretrained_model" / "model.safetensors")
        for s in (straight, resumed)
    ]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


@pytest.fixture
def agent_store(monkeypatch):
    """A store where torchrun's agent would serve one, and the environment a worker sees."""
    from torch.distributed import TCPStore

    from trainer.data.sources import hub

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    env = {"TORCHELASTIC_USE_AGENT_STORE": "True", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}
    for name, value in {**env, "MASTER_PORT": str(store.port), "GROUP_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    hub.download_once.cache_clear()
    yield store
    hub.download_once.cache_clear()


def test_the_first_rank_shares_its_failed_download_with_the_others(agent_store, monkeypatch) -> None:
    from trainer.data.sources import hub

    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(ConfigError, match=r"--dataset.repo_id=nobody/gone: no local copy") as first:
        hub.download_once("nobody/gone")
    monkeypatch.setenv("LOCAL_RANK", "1")  # another rank of the node: takes the outcome, no Hub call
    monkeypatch.setattr(hub, "_snapshot", lambda *a, **k: pytest.fail("the other rank must not download"))
    with pytest.raises(ConfigError) as other:
        hub.download_once("nobody/gone")
    assert str(other.value) == str(first.value)


def test_the_other_ranks_read_the_snapshot_the_first_rank_fetched(
    agent_store, dataset_root, monkeypatch
) -> None:
    from helpers.hf_cache import put_in_hub_cache
    from trainer.data.sources import hub

    put_in_hub_cache(dataset_root[0], "me/fetched", repo_type="dataset")
    monkeypatch.setenv("LOCAL_RANK", "1")
    agent_store.set(hub._key("me/fetched"), "ok")  # what the first rank publishes after its download
    loaded = LeRobotConfig(repo_id="me/fetched").load()
    assert len(loaded) == sum(LENGTHS)
