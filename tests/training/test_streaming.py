"""`--dataset.streaming=true`: a LeRobotDataset with videos read in place from a real S3-compatible
server (moto, through s3fs) or from the loopback Hub (huggingface_hub's HfFileSystem), never downloaded.

Every streamed item equals the local one, a streamed run trains to the local run's weights byte for
byte and resumes exactly (from S3 and from the Hub, a streamed mixture to the local mixture's), the
block cache stays within `--dataset.cache_size`, a flaky store is retried and counted (in DataLoader
workers too), and an unreachable store, missing credentials, a missing Hub repo or revision or a
damaged remote file is one line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest
import torch

import trainer
from helpers.fixtures import copy_fixture, fixture_dir
from helpers.hub_server import HubServer
from helpers.run_outputs import metrics, model_file
from trainer.cli import main
from trainer.cli.parse import parse_config
from trainer.data.format import remote
from trainer.engine.plan import train
from trainer.errors import ConfigError

CAMERA_POLICY = "helpers.camera_policy:CameraPolicyConfig"
TRAINER_CLI = Path(sys.executable).with_name("trainer")


@pytest.fixture(scope="module")
def local_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_fixture(tmp_path_factory.mktemp("stream"), "lerobot", "dataset_video")


@pytest.fixture(scope="module")
def bucket(s3_server):
    """A bucket for this module's datasets, deleted afterwards."""
    store = fsspec.filesystem("s3", use_listings_cache=False)
    name = f"stream-{uuid.uuid4().hex[:12]}"
    store.mkdir(name)
    yield f"s3://{name}"
    store.rm(name, recursive=True)


def upload(local: Path, url: str) -> str:
    fsspec.filesystem("s3", use_listings_cache=False).put(f"{local}/", url, recursive=True)
    return url


@pytest.fixture(scope="module")
def url(bucket, local_root) -> str:
    return upload(local_root, f"{bucket}/dataset_video")


def assert_items_equal(local, streamed) -> None:
    assert len(local) == len(streamed)
    for i in range(len(local)):
        expected, got = local[i], streamed[i]
        assert expected.keys() == got.keys()
        for key, value in expected.items():
            assert torch.equal(value, got[key]) if isinstance(value, torch.Tensor) else value == got[key]


def test_every_streamed_item_equals_the_local_item_within_the_cache_bound(url, local_root) -> None:
    streamed = trainer.open_dataset(root=url, streaming=True, cache_size="64KiB")
    assert_items_equal(trainer.open_dataset(root=local_root), streamed)
    store = streamed.cameras.info.root.store
    assert 0 < store.held <= 64 * 1024  # the videos alone are larger: blocks were evicted


def test_a_streamed_run_trains_and_resumes_to_the_local_runs_bytes(
    url, local_root, tmp_path, clean_accelerate
):
    from accelerate.state import AcceleratorState

    flags = [f"--policy.type={CAMERA_POLICY}", "--policy.dropout=0", "--use_policy_training_preset=false"]
    flags += ["--scheduler.type=constant", "--batch_size=8", "--save_freq=2", "--log_freq=2", "--seed=3"]
    stream = ["--dataset.streaming=true", f"--dataset.root={url}", "--dataset.cache_size=256KiB"]
    runs = {
        "local": [f"--dataset.root={local_root}", "--num_workers=0", "--steps=4"],
        "streamed": [*stream, "--num_workers=2", "--steps=4"],
        "resumed": [*stream, "--num_workers=0", "--steps=2"],
    }
    for name, extra in runs.items():
        train(parse_config([*flags, *extra, f"--output_dir={tmp_path / name}"]))
        AcceleratorState._reset_state(reset_partial_state=True)
    train(parse_config(["--resume=true", "--steps=4", f"--output_dir={tmp_path / 'resumed'}"]))
    weights = [model_file(tmp_path / name, 4).read_bytes() for name in runs]
    assert weights[1] == weights[0] and weights[2] == weights[0]
    logged = metrics(tmp_path / "streamed")
    assert [r["stream_retries"] for r in logged if "loss" in r] == [0, 0]


class Flaky:
    """The store's `cat_file`, failing the calls numbered in `failing` with a reset connection."""

    def __init__(self, original, failing: set[int]) -> None:
        self.original, self.failing, self.calls = original, failing, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls in self.failing:
            raise ConnectionResetError("connection reset by peer")
        return self.original(*args, **kwargs)


def test_a_flaky_store_is_retried_and_counted_and_a_dead_one_is_one_line(
    url, local_root, monkeypatch
) -> None:
    fs = fsspec.filesystem("s3", use_listings_cache=False)
    flaky = Flaky(fs.cat_file, failing={1, 3, 4})
    monkeypatch.setattr(fs, "cat_file", flaky)
    before = remote.retry_count() or 0
    streamed = trainer.open_dataset(root=url, streaming=True, cache_size="1MiB")
    assert remote.retry_count() - before == 3
    assert_items_equal(trainer.open_dataset(root=local_root), streamed)
    monkeypatch.setattr(remote, "BACKOFF_S", (0.0, 0.0, 0.0))
    flaky.failing = set(range(flaky.calls + 1, flaky.calls + 100))
    with pytest.raises(
        remote.StreamError, match=rf"^cannot read {url}/\S+ after 4 attempts \(ConnectionResetError"
    ):
        trainer.open_dataset(root=url, streaming=True)


def test_retries_in_dataloader_workers_are_counted_in_the_log(url, tmp_path, clean_accelerate, monkeypatch):
    """The first GET of every process fails once: the main process's and each of the 2 workers'
    (their client and cache are their own), so the run's log counts 3 retries."""
    import s3fs

    original, failed = s3fs.S3FileSystem._cat_file, set()

    async def first_fails(self, *args, **kwargs):
        if os.getpid() not in failed:
            failed.add(os.getpid())
            raise ConnectionResetError("connection reset by peer")
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_cat_file", first_fails)
    monkeypatch.setattr(remote, "BACKOFF_S", (0.0, 0.0, 0.0))
    s3fs.S3FileSystem.clear_instance_cache()  # a new client, its sync methods bound to the patched one
    before = remote.retry_count() or 0
    flags = [f"--policy.type={CAMERA_POLICY}", "--dataset.streaming=true", f"--dataset.root={url}"]
    flags += ["--num_workers=2", "--steps=2", "--log_freq=2", "--batch_size=8", f"--output_dir={tmp_path}"]
    train(parse_config(flags))
    s3fs.S3FileSystem.clear_instance_cache()  # no client bound to the patched method outlives the test
    logged = metrics(tmp_path)
    assert [r["stream_retries"] - before for r in logged if "loss" in r] == [3]


def damaged(local_root: Path, tmp_path: Path, relative: str) -> Path:
    copy = copy_fixture(tmp_path, "lerobot", "dataset_video")
    target = copy / relative
    target.write_bytes(target.read_bytes()[: target.stat().st_size // 3])
    return copy


@pytest.mark.parametrize(
    "relative",
    ["data/chunk-000/file-000.parquet", "videos/observation.images.top/chunk-000/file-000.mp4"],
)
def test_a_damaged_remote_file_is_one_line_naming_it(bucket, local_root, tmp_path, relative) -> None:
    url = upload(damaged(local_root, tmp_path, relative), f"{bucket}/damaged-{uuid.uuid4().hex[:6]}")
    with pytest.raises(ConfigError) as error:  # at open (the parquet) or at the first frame past the cut
        dataset = trainer.open_dataset(root=url, streaming=True)
        [dataset[i] for i in range(len(dataset))]
    line = str(error.value)
    assert "\n" not in line and line.startswith(f"{url}/{relative}")


def cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(TRAINER_CLI), *args], capture_output=True, text=True, timeout=120, env=env)


def test_an_unreachable_store_and_missing_credentials_are_one_line(url, s3_server) -> None:
    info = ["dataset", "info", "--dataset.streaming=true", f"--dataset.root={url}"]
    closed = {**os.environ, "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_MAX_ATTEMPTS": "1"}
    result = cli(info, closed)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(
        f"error: cannot read {url}/meta/info.json"
    )
    assert "AWS_ENDPOINT_URL" in result.stderr
    anonymous = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    anonymous |= {"AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_CONFIG_FILE": "/nonexistent"}
    result = cli(info, {**anonymous, "AWS_EC2_METADATA_DISABLED": "true"})
    assert result.returncode == 1 and result.stderr.count("\n") == 1
    assert f"--dataset.root={url}: no AWS credentials found" in result.stderr


def test_dataset_info_reads_a_streamed_root(url, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["dataset", "info", "--dataset.streaming=true", f"--dataset.root={url}", "--json"])
    summary = json.loads(capsys.readouterr().out)
    assert exit_info.value.code in (0, None) and summary["root"] == url
    assert summary["bytes"]["videos"] == sum(
        f.stat().st_size for f in (fixture_dir("lerobot", "dataset_video") / "videos").rglob("*.mp4")
    )


def trained_weights(flags: list[str], out: Path) -> bytes:
    """The model.safetensors a short camera-policy run with `flags` ends with."""
    from accelerate.state import AcceleratorState

    base = [f"--policy.type={CAMERA_POLICY}", "--policy.dropout=0", "--use_policy_training_preset=false"]
    base += ["--scheduler.type=constant", "--batch_size=8", "--steps=2", "--save_freq=2", "--seed=3"]
    train(parse_config([*base, "--num_workers=0", *flags, f"--output_dir={out}"]))
    AcceleratorState._reset_state(reset_partial_state=True)
    return model_file(out, 2).read_bytes()


def test_a_streamed_mixture_trains_to_the_local_mixtures_bytes(
    url, local_root, bucket, tmp_path, clean_accelerate, capsys
) -> None:
    images = copy_fixture(tmp_path, "lerobot", "dataset_images")
    images_url = upload(images, f"{bucket}/dataset_images")
    mixture = ["--dataset.weights=[3,1]", "--dataset.cache_size=512KiB"]
    local = trained_weights([f"--dataset.root=[{local_root},{images}]", *mixture], tmp_path / "local")
    streamed = [f"--dataset.root=[{url},{images_url}]", "--dataset.streaming=true", *mixture]
    config = parse_config(streamed).dataset
    assert [m.root for m in config.members] == [url, images_url]  # as train_config.json records them
    assert config.member_config(1).cache_bytes() == 256 * 1024  # the members split the cache
    assert trained_weights(streamed, tmp_path / "streamed") == local
    with pytest.raises(SystemExit):
        main(["dataset", "info", *streamed[:3], "--json"])
    summary = json.loads(capsys.readouterr().out)["mixture"]
    assert [(m["member"], m["root"]) for m in summary] == [
        ("dataset_video", url),
        ("dataset_images", images_url),
    ]


@pytest.fixture
def hub(local_root, monkeypatch) -> Iterator[tuple[HubServer, str]]:
    """The loopback Hub serving the video dataset as `acme/arm_video`, and its commit's oid."""
    with HubServer() as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        files = {str(p.relative_to(local_root)): p.read_bytes() for p in local_root.rglob("*") if p.is_file()}
        yield server, server.add_dataset("acme/arm_video", files)


def test_a_run_streamed_from_the_hub_trains_to_the_local_runs_bytes(
    hub, local_root, tmp_path, clean_accelerate
) -> None:
    server, oid = hub
    local = trained_weights([f"--dataset.root={local_root}"], tmp_path / "local")
    streamed = [f"--dataset.root=hf://datasets/acme/arm_video@{oid}", "--dataset.streaming=true"]
    assert trained_weights([*streamed, "--dataset.cache_size=256KiB"], tmp_path / "streamed") == local
    reads = [r for r in server.state.requests if r.route == "resolve"]
    assert reads and all(r.range for r in reads)  # ranged reads only, never a whole file


@pytest.mark.parametrize(
    ("root", "cause"),
    [
        ("hf://datasets/acme/missing", "repository not found"),
        ("hf://datasets/acme/arm_video@v9", "revision not found"),
    ],
)
def test_a_missing_hub_repo_or_revision_is_one_line(hub, root, cause) -> None:
    server, _ = hub
    with pytest.raises(remote.StreamError) as error:
        trainer.open_dataset(root=root, streaming=True)
    assert str(error.value).startswith(f"--dataset.root={root}: {cause} on {server.url}; check the repo id")
    assert "\n" not in str(error.value)
