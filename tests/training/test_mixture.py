"""Weighted mixtures of LeRobotDatasets (data/sources/mixture.py, data/pipeline/mixture.py): both
spellings resolve to the members train_config.json records; the pooled statistics are those of the
concatenated frames; the weighted order is exact per epoch, deterministic and the same whatever the
ranks; each batch comes from the right member under the mixture's names; bad input is one line naming
the member."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers.fixtures import copy_fixture, fixture_dir
from trainer.cli import main
from trainer.cli.parse import parse_config
from trainer.config.train import encode_config
from trainer.data.dataset import ALL_CAMERAS
from trainer.data.format import metadata as fmt
from trainer.data.pipeline.mixture import pool_stats
from trainer.data.pipeline.sampler import GlobalOrderSampler, WeightedOrder
from trainer.data.sources.mixture import MixtureConfig
from trainer.errors import ConfigError

VIDEO, IMAGES, TINY = (
    str(fixture_dir("lerobot", name)) for name in ("dataset_video", "dataset_images", "dataset_tiny")
)
TOP, WRIST = "observation.images.top", "observation.images.wrist"


def _write(path: Path, members: list[dict]) -> str:
    path.write_text(json.dumps(members))
    return str(path)


def _mixture(tmp_path: Path, members: list[dict], *flags: str) -> MixtureConfig:
    config = parse_config([f"--dataset.mixture={_write(tmp_path / 'mixture.json', members)}", *flags])
    assert isinstance(config.dataset, MixtureConfig)
    return config.dataset


def test_both_spellings_record_the_same_members_and_resume_from_them_alone(tmp_path) -> None:
    listed = parse_config([f"--dataset.root=[{VIDEO},{IMAGES}]", "--dataset.weights=[3,1]"]).dataset
    relative = [
        {"root": "lerobot/dataset_video", "weight": 3},
        {"root": "lerobot/dataset_images", "weight": 1},
    ]
    folder = tmp_path / "data"
    for name in ("dataset_video", "dataset_images"):
        copy_fixture(folder / "lerobot", "lerobot", name)
    from_file = parse_config([f"--dataset.mixture={_write(folder / 'm.json', relative)}"]).dataset
    assert [m.weight for m in listed.members] == [m.weight for m in from_file.members] == [3.0, 1.0]
    assert from_file.members[0].root == str(folder / "lerobot" / "dataset_video")  # relative to the file
    explicit = parse_config(["--dataset.type=lerobot", f"--dataset.root=[{VIDEO},{IMAGES}]"]).dataset
    assert isinstance(explicit, MixtureConfig) and [m.weight for m in explicit.members] == [1.0, 1.0]

    saved = tmp_path / "train_config.json"  # what a checkpoint records, the mixture file gone
    saved.write_text(json.dumps(encode_config(parse_config([f"--dataset.mixture={folder / 'm.json'}"]))))
    (folder / "m.json").unlink()
    resumed = parse_config([f"--config_path={saved}"]).dataset
    assert isinstance(resumed, MixtureConfig) and resumed.members == from_file.members


@pytest.mark.numerics
def test_pooled_statistics_are_those_of_the_concatenated_frames(tmp_path) -> None:
    members = [{"root": VIDEO, "weight": 5}, {"root": IMAGES, "weight": 1}, {"root": TINY, "weight": 2}]
    mixture = _mixture(tmp_path, members).load(["observation.state"])
    frames = {key: [] for key in ("observation.state", "action")}
    for root in (VIDEO, IMAGES, TINY):
        info, ranges = fmt.read_info(Path(root)), fmt.read_episode_ranges(Path(root))
        read, _ = fmt.read_frames(info, sorted(ranges), ranges, list(frames))
        for key in frames:
            frames[key].append(read[key].astype(np.float64))
    stats = mixture.stats()
    for key, parts in frames.items():
        every = np.concatenate(parts)  # 200 frames: pooled by frames, whatever the sampling weights
        np.testing.assert_allclose(stats[key]["mean"].numpy(), every.mean(0), rtol=0, atol=2e-7)
        np.testing.assert_allclose(stats[key]["std"].numpy(), every.std(0), rtol=0, atol=2e-7)
        assert not np.allclose(stats[key]["mean"].numpy(), parts[0].mean(0), atol=1e-3)  # not one member's


def test_pool_stats_is_exact_for_members_of_any_size() -> None:
    rng = np.random.default_rng(0)
    parts = [rng.normal(loc, scale, (n, 3)) for loc, scale, n in ((0, 1, 7), (5, 0.1, 100), (-2, 3, 1))]

    def of(x: np.ndarray) -> dict[str, torch.Tensor]:
        values = {"mean": x.mean(0), "std": x.std(0), "min": x.min(0), "max": x.max(0), "count": [len(x)]}
        quantiles = {"q01": np.quantile(x, 0.01, axis=0), "q99": np.quantile(x, 0.99, axis=0)}
        return {k: torch.tensor(np.asarray(v)) for k, v in {**values, **quantiles}.items()} | {
            "q10": torch.zeros(3)
        }

    members = [of(x) for x in parts]
    pooled = pool_stats([{"k": m} for m in members], [len(x) for x in parts])["k"]
    every = np.concatenate(parts)
    for name, value in of(every).items():
        if name not in ("q01", "q99", "q10"):
            np.testing.assert_allclose(pooled[name].numpy(), value.numpy(), rtol=1e-12, atol=0)
    # quantiles do not pool exactly from quantiles: q01/q99 (pi0.5's bounds) are the frame-weighted
    # mean of the members', as LeRobot's aggregate_stats takes them; any other is left out
    for name in ("q01", "q99"):
        weighted = sum(len(x) * m[name].numpy() for x, m in zip(parts, members, strict=True)) / len(every)
        np.testing.assert_allclose(pooled[name].numpy(), weighted, rtol=1e-12)
    assert "q10" not in pooled


def test_the_weighted_order_is_exact_per_epoch_and_walks_every_frame() -> None:
    order = WeightedOrder([10, 30, 4], [1, 1, 2], ["a", "b", "c"])
    assert order.shares == [11, 11, 22]  # 44 positions: 11/11/22, the remainder to the earliest
    first, again, second = order.order(7, 0), order.order(7, 0), order.order(7, 1)
    assert torch.equal(first, again) and not torch.equal(first, second)
    for epoch in (first, second):
        assert order.counts(epoch).tolist() == [11, 11, 22]
        c = epoch[order.member_of(epoch) == 2] - 40
        assert all(
            (c[i : i + 4].sort().values == torch.arange(4)).all() for i in range(0, 20, 4)
        )  # full walks
        b = epoch[order.member_of(epoch) == 1]
        assert len(set(b.tolist())) == 11  # undersampled: distinct frames, another part each epoch
    assert set(first[order.member_of(first) == 1].tolist()) != set(
        second[order.member_of(second) == 1].tolist()
    )


def test_the_order_is_the_same_on_any_number_of_ranks() -> None:
    order = WeightedOrder([20, 12], [3, 1], ["a", "b"])
    single = GlobalOrderSampler(32, 8, 1, 0, seed=3, weighted=order)
    ranks = [GlobalOrderSampler(32, 4, 2, r, seed=3, weighted=order) for r in range(2)]
    for _ in range(9):  # across epoch ends
        whole = single.next_indices()
        assert torch.equal(whole, torch.cat([s.next_indices() for s in ranks]))
        assert torch.equal(whole, ranks[0].last_global)
    resumed = GlobalOrderSampler(32, 4, 2, 1, seed=3, weighted=order)
    resumed.set_position(*ranks[1].position)
    assert torch.equal(resumed.next_indices(), ranks[1].next_indices())


def test_each_sample_comes_from_its_member_under_the_mixtures_names(tmp_path) -> None:
    swap = {TOP: WRIST, WRIST: TOP}  # the images member's cameras served the other way round
    members = [
        {"root": VIDEO, "weight": 1, "episodes": [1, 3]},
        {"root": IMAGES, "weight": 1, "rename_map": swap},
        {"root": VIDEO, "weight": 2, "episodes": [0]},  # the same dataset again, another slice
    ]
    config = _mixture(tmp_path, members)
    mixture = config.load([ALL_CAMERAS])
    assert config.labels() == ["dataset_video#0", "dataset_images", "dataset_video#2"]
    video, images = (MixtureConfig(root=f"[{root}]").load([ALL_CAMERAS]) for root in (VIDEO, IMAGES))
    sizes = [len(m) for m in mixture.members]
    assert sizes == [40, 80, 20] and len(mixture) == 140
    indices = torch.tensor([45, 3, 130, 119, 0])
    batch = mixture.gather(indices, 3)
    expected = [
        images.gather(torch.tensor([5]), 3),
        video.gather(torch.tensor([20 + 3]), 3),  # episode 1 starts at frame 20
        video.gather(torch.tensor([10]), 3),  # member 2: episode 0
        images.gather(torch.tensor([79]), 3),
        video.gather(torch.tensor([20]), 3),
    ]
    for row, want in enumerate(expected):
        from_images = row in (0, 3)
        for key in ("observation.state", "action", "action_is_pad"):
            assert torch.equal(batch[key][row], want[key][0])
        for camera in (TOP, WRIST):
            source = swap[camera] if from_images else camera
            assert torch.equal(batch[camera][row], want[source][0])


@pytest.mark.parametrize(
    ("members", "flags", "message"),
    [
        ([{"root": VIDEO, "weight": 1}, {"root": TINY, "weight": -2}], [], "mixture member 1 (dataset_tiny) has weight -2: weights must be positive"),
        ([{"root": VIDEO, "weight": 0}, {"root": TINY, "weight": 0}], [], "the mixture's weights sum to 0"),
        ([{"root": VIDEO, "weight": 1}, {"root": TINY, "wieght": 1}], [], "member 1 has field 'wieght'"),
        ([{"repo_id": "a/b", "revision": "v1"}, {"repo_id": "a/b", "revision": "v2"}], [], "mixture member 1 (a/b#1) reads a/b at revision v2, member 0 at v1"),
        ([{"root": VIDEO}], ["--dataset.episodes=[1]"], "give each member its `episodes` in the --dataset.mixture file"),
    ],
)  # fmt: skip
def test_bad_mixtures_are_one_line_naming_the_member(tmp_path, members, flags, message) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)) as error:
        _mixture(tmp_path, members, *flags)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ([f"--dataset.root=[{VIDEO},{TINY}]", "--dataset.weights=[1]"], "--dataset.weights gives 1 weights for 2 datasets"),
        ([f"--dataset.root=[{VIDEO},{TINY}]", "--dataset.weights=[1,2,3]"], "--dataset.weights gives 3 weights for 2 datasets"),
        (["--dataset.repo_id=[a/b,c/d]", f"--dataset.root=[{VIDEO}]"], "--dataset.repo_id lists 2 datasets and --dataset.root 1"),
    ],
)  # fmt: skip
def test_bad_mixture_flags_are_one_line(flags, message) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_config(flags)


def _edited(tmp_path: Path, name: str, **info: object) -> str:
    root = copy_fixture(tmp_path, "lerobot", name)
    data = json.loads((root / "meta" / "info.json").read_text())
    for key, value in info.items():
        keys = key.split("__")
        target = data
        for part in keys[:-1]:
            target = target[part]
        target[keys[-1]] = value
    (root / "meta" / "info.json").write_text(json.dumps(data))
    return str(root)


def _taller_top_camera(tmp_path: Path) -> str:
    """The images fixture with its top camera 48x40, images and info.json alike (a valid dataset:
    a declared size its images do not have is refused at open, before members are compared)."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    root = Path(
        _edited(tmp_path, "dataset_images", **{"features__observation.images.top__shape": [48, 40, 3]})
    )
    top = "observation.images.top"
    for path in sorted((root / "data").glob("chunk-*/file-*.parquet")):
        table = pq.read_table(path)
        taller = []
        for value in table.column(top).to_pylist():
            out = io.BytesIO()
            Image.open(io.BytesIO(value["bytes"])).resize((40, 48)).save(out, format="PNG")
            taller.append({**value, "bytes": out.getvalue()})
        index = table.column_names.index(top)
        pq.write_table(table.set_column(index, top, pa.array(taller, table.column(top).type)), path)
    return str(root)


@pytest.mark.parametrize(
    ("second", "features", "message"),
    [
        (lambda t: TINY, [ALL_CAMERAS], "mixture member 1 (dataset_tiny): has no camera observation.images.top (its cameras: none): map one of its cameras to it in the member's rename_map, or leave observation.images.top out of --policy.input_features"),
        (lambda t: IMAGES, ["observation.environment_state"], "mixture member 1 (dataset_images): has no feature observation.environment_state"),
        (lambda t: _edited(t, "dataset_images", fps=30), [], "the mixture's members disagree on fps (dataset_tiny 10, dataset_images 30)"),
        (lambda t: _edited(t, "dataset_images", features__action__shape=[3]), [], "the mixture's members disagree on action size (dataset_tiny 2, dataset_images 3)"),
        (lambda t: _edited(t, "dataset_images", codebase_version="v2.1"), [], "mixture member 1 (dataset_images): "),
        (_taller_top_camera, [ALL_CAMERAS], "mixture member 1 (dataset_images): its camera observation.images.top is 3x48x40, another member's 3x24x40: this policy reads frames at their recorded size"),
    ],
)  # fmt: skip
def test_members_that_disagree_are_refused_in_one_line(tmp_path, second, features, message) -> None:
    first = TINY if ALL_CAMERAS not in features else VIDEO
    config = _mixture(tmp_path, [{"root": first}, {"root": second(tmp_path)}])
    with pytest.raises(ConfigError, match=re.escape(message)) as error:
        config.load(features)
    assert "\n" not in str(error.value)
    if "v2.1" in message or message.endswith(": "):
        assert "is a LeRobotDataset v2.1; the trainer reads v3.0" in str(error.value)


def test_a_bad_mixture_ends_trainer_train_in_one_line(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "train",
                f"--dataset.root=[{VIDEO},{TINY}]",
                "--dataset.weights=[0,0]",
                f"--output_dir={tmp_path}",
            ]
        )
    err = capsys.readouterr().err
    assert exit_info.value.code == 1 and err.strip().splitlines() == [
        "error: the mixture's weights sum to 0: give every member a positive weight"
    ]


def test_dataset_info_describes_each_member(tmp_path, capsys) -> None:
    members = [{"root": VIDEO, "weight": 3, "episodes": [0, 2]}, {"root": TINY, "weight": 1}]
    path = _write(tmp_path / "m.json", members)
    with pytest.raises(SystemExit) as exit_info:
        main(["dataset", "info", f"--dataset.mixture={path}", "--json"])
    summary = json.loads(capsys.readouterr().out)["mixture"]
    assert exit_info.value.code in (0, None)
    assert [(m["member"], m["weight"], m["episodes_used"], m["frames"]) for m in summary] == [
        ("dataset_video", 0.75, [0, 2], 80),
        ("dataset_tiny", 0.25, None, 40),
    ]
    assert summary[0]["cameras"][TOP]["encoding"] == "av1 yuv420p"


def test_eval_split_holds_out_episodes_of_every_member() -> None:
    config = parse_config([f"--dataset.root=[{VIDEO},{TINY}]", "--dataset.eval_split=0.25"]).dataset
    train, held_out = config.load(["observation.state"]), config.load_validation(["observation.state"])
    assert held_out is not None
    assert [len(m) for m in train.members] == [60, 20] and [len(m) for m in held_out.members] == [20, 20]
    assert held_out.episode_bounds().tolist() == [[0, 20], [20, 40]]  # video's episode 3, tiny's episode 1
    video = MixtureConfig(root=f"[{VIDEO}]").load(["observation.state"])
    last = held_out.gather(torch.tensor([19]), 1)["observation.state"]
    assert torch.equal(last, video.gather(torch.tensor([79]), 1)["observation.state"])


def test_repo_ids_alone_read_each_member_through_the_hub_cache(tmp_path, monkeypatch) -> None:
    from helpers.hf_cache import put_in_hub_cache

    cache = tmp_path / "hub"
    for name, repo in (("dataset_video", "lab/arm_a"), ("dataset_tiny", "lab/arm_b")):
        put_in_hub_cache(fixture_dir("lerobot", name), repo, "dataset", str(cache))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    config = parse_config(["--dataset.repo_id=[lab/arm_a,lab/arm_b]", "--dataset.weights=[1,3]"]).dataset
    mixture = config.load(["observation.state"])
    assert config.labels() == ["lab/arm_a", "lab/arm_b"] and [len(m) for m in mixture.members] == [80, 40]
    assert mixture.weighted_order.shares == [30, 90]


def test_dataset_show_asks_for_one_member(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["dataset", "show", f"--dataset.root=[{VIDEO},{TINY}]", "--episode=0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 1 and err == [
        "error: trainer dataset show draws one dataset: pass one member's --dataset.root or --dataset.repo_id"
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[{", "cannot read it as JSON"),
        ('{"root": "x"}', "must hold a non-empty JSON list of members"),
        ('[{"root": "x", "weight": "3"}]', "member 0: weight must be a number, got '3'"),
        ('[{"root": "x", "episodes": [0, "1"]}]', "member 0: episodes must be a list of episode indices"),
    ],
)
def test_a_malformed_mixture_file_is_one_line(tmp_path, text, message) -> None:
    path = tmp_path / "mixture.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(message)) as error:
        parse_config([f"--dataset.mixture={path}"])
    assert "\n" not in str(error.value) and str(path) in str(error.value)
