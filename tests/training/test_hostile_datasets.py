"""Damaged copies of the LeRobot-written dataset fixtures, each read by every reader of datasets.

A dataset is input as hostile as a checkpoint. Each `Damage` below copies one committed fixture
(tests/fixtures/lerobot/dataset_video, dataset_images, dataset_tiny, dataset_channel_first) and breaks
one thing in it; each `Reader` reads the copy as a user would. The outcome of every (damage, reader)
pair is checked: one `error: ...` line matching the damage's `line`, exit 1 and no traceback; or
success where the reader never reads the damaged part (`passes`) or the data is valid (`line=None`).

A new reader inherits every case by adding itself to `READERS`. The streamed one does: a training run
with --dataset.streaming=true reads each damaged copy uploaded to the S3 test server (one bucket for the
module) and ends in the same line, naming the object where the local reader names the file; a damage an
object store cannot hold (a symlink, a FIFO, a directory) is read locally only.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import struct
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from helpers.fixtures import copy_fixture
from helpers.high_water import run_child
from trainer.cli import main
from trainer.data.sources.lerobot import open_dataset
from trainer.errors import TrainerError

pytestmark = pytest.mark.timeout(600)

CAMERA_POLICY = "helpers.camera_policy:CameraPolicyConfig"
TOP = "observation.images.top"
TOP_VIDEO = f"videos/{TOP}/chunk-000/file-000.mp4"
FRONT, SIDE = "observation.images.front", "observation.images.side"  # dataset_channel_first's
DATA = "data/chunk-000/file-000.parquet"
EPISODES = "meta/episodes/chunk-000/file-000.parquet"


# ---------------------------------------------------------------- the readers


@dataclass(frozen=True)
class Reader:
    """Reads the dataset at `root` as a user would; returns (exit code, stderr). A `streamed` reader
    reads the copy uploaded to the S3 test server with --dataset.streaming=true (`root` is its URL) and
    ends as its local reader `local` does, its line naming the object instead of the file."""

    name: str
    read: Callable[[str, Path, int, bool, pytest.CaptureFixture[str]], tuple[int, str]]
    streamed: bool = False

    @property
    def local(self) -> str:
        """The local reader whose outcome this one shares (the one `Damage.passes` names)."""
        return self.name.removeprefix("streamed ")


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    return int(exit_info.value.code or 0), capsys.readouterr().err


def _root(root: str, streamed: bool) -> list[str]:
    return [f"--dataset.root={root}", *(["--dataset.streaming=true"] if streamed else [])]


def _info(root: str, work: Path, episode: int, streamed: bool, capsys) -> tuple[int, str]:
    return _cli(["dataset", "info", *_root(root, streamed)], capsys)


def _show(root: str, work: Path, episode: int, streamed: bool, capsys) -> tuple[int, str]:
    args = ["dataset", "show", *_root(root, streamed), f"--episode={episode}", f"--output={work / 's.png'}"]
    return _cli(args, capsys)


def _open(root: str, work: Path, episode: int, streamed: bool, capsys) -> tuple[int, str]:
    """`open_dataset` and every item: a TrainerError is the library's one line (exit 1 in a CLI)."""
    try:
        dataset = open_dataset(root=root, streaming=streamed)
        for i in range(len(dataset)):
            dataset[i]
    except TrainerError as exc:
        return 1, f"error: {exc}\n"
    return 0, ""


def _train(workers: int) -> Callable[[str, Path, int, bool, pytest.CaptureFixture[str]], tuple[int, str]]:
    def read(root: str, work: Path, episode: int, streamed: bool, capsys) -> tuple[int, str]:
        from accelerate.state import AcceleratorState

        tiny = root.rstrip("/").endswith("dataset_tiny")
        policy = "mlp" if tiny else CAMERA_POLICY  # never read a damaged file here
        args = ["train", *_root(root, streamed), f"--policy.type={policy}", f"--num_workers={workers}"]
        args += ["--steps=2", "--batch_size=8", "--save_freq=2", "--log_freq=1", "--collective_timeout_s=60"]
        try:
            return _cli([*args, f"--output_dir={work / f'run{workers}'}"], capsys)
        finally:
            AcceleratorState._reset_state(reset_partial_state=True)

    return read


READERS = [
    Reader("info", _info),
    Reader("show", _show),
    Reader("open", _open),
    Reader("train0", _train(0)),
    Reader("train2", _train(2)),
    Reader("streamed train0", _train(0), streamed=True),  # a run reads every part a damage is in
]


# ---------------------------------------------------------------- the damages


@dataclass(frozen=True)
class Damage:
    """One fixture with one thing broken by `apply(root)`; `line`: the regex the error line matches
    (None: the data is valid and every reader succeeds); `passes`: readers that never read the damaged
    part and succeed; `episode`: the episode `show` draws (one holding the damage); `local_only`: a
    damage an object store cannot hold (a symlink, a FIFO, a directory), so no streamed reader reads it
    (`video_path ../outside` is the store's way out of the root)."""

    name: str
    fixture: str
    apply: Callable[[Path], None] | None
    line: str | None
    passes: frozenset[str] = frozenset()
    episode: int = 0
    local_only: bool = False


def _json(relative: str, change: Callable[[dict], object]) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        data = json.loads((root / relative).read_text())
        change(data)
        (root / relative).write_text(json.dumps(data))  # NaN/Infinity as JSON's extension tokens

    return apply


def _set(*path_and_value: object) -> Callable[[dict], None]:
    *keys, value = path_and_value

    def change(data: dict) -> None:
        for key in keys[:-1]:
            data = data[key]
        data[keys[-1]] = value

    return change


def _rename_camera(data: dict) -> None:
    data["features"]["observation.images.../../top"] = data["features"].pop(TOP)


def _column(relative: str, name: str, change: Callable[[list], list]) -> Callable[[Path], None]:
    """Rewrite one parquet column through `change(values as Python objects)`, keeping its type."""

    def apply(root: Path) -> None:
        table = pq.read_table(root / relative)
        column = table.column(name)
        values = change(column.to_pylist())
        table = table.set_column(table.column_names.index(name), name, pa.array(values, column.type))
        pq.write_table(table, root / relative)

    return apply


def _row(index: int, value: object) -> Callable[[list], list]:
    def change(values: list) -> list:
        values[index] = value
        return values

    return change


def _vector_row(index: int, position: int, value: float) -> Callable[[list], list]:
    def change(values: list) -> list:
        values[index] = list(values[index])
        values[index][position] = value
        return values

    return change


def _images(replace: Callable[[int, dict], dict]) -> Callable[[list], list]:
    return lambda values: [replace(i, v) for i, v in enumerate(values)]


def _png_header(width: int, height: int, gray: bool = True, pixels: bool = False) -> bytes:
    """A PNG declaring `width` x `height`: a few bytes of header (and, with `pixels`, all-zero pixel
    data, compressed to a few hundred KB, so a decoder would really allocate and fill the image)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 0 if gray else 2, 0, 0, 0)
    data = b""
    if pixels:
        compressor, row = zlib.compressobj(9), bytes(width + 1)
        data = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b"")


def _replace_file(relative: str, make: Callable[[Path], None]) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        (root / relative).unlink()
        make(root / relative)

    return apply


def _truncate(relative: str, keep: float) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        data = (root / relative).read_bytes()
        (root / relative).write_bytes(data[: int(len(data) * keep)])

    return apply


def _audio_only_mp4(path: Path) -> None:
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream("aac", rate=8000)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
        frame.sample_rate = 8000
        for packet in [*stream.encode(frame), *stream.encode()]:
            container.mux(packet)


def _outside_copy(relative: str) -> Callable[[Path], None]:
    """`relative` becomes a symlink to a valid copy of itself outside the root: a reader that follows
    it would succeed, so only the refusal passes the case."""

    def apply(root: Path) -> None:
        outside = root.parent / "outside" / Path(relative).name
        outside.parent.mkdir(exist_ok=True)
        shutil.move(root / relative, outside)
        (root / relative).symlink_to(outside)

    return apply


def _videos_outside(root: Path) -> None:
    shutil.copytree(root / "videos", root.parent / "outside")
    _json(
        "meta/info.json",
        _set("video_path", "../outside/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"),
    )(root)


def _both(*applies: Callable[[Path], None]) -> Callable[[Path], None]:
    return lambda root: [apply(root) for apply in applies] and None


def _template(value: str) -> Callable[[Path], None]:
    return _json("meta/info.json", _set("video_path", value))


def _garbage_after_first(i: int, value: dict) -> dict:
    """Every frame of the images fixture but each episode's first (episodes of 20 frames): not an image."""
    return value if i % 20 == 0 else {"bytes": b"not an image", "path": None}


OUTSIDE = "outside the dataset root"
NOT_INFO = frozenset({"info"})
TRAINING_ONLY = frozenset({"info", "show", "open"})  # stats are read for the normalization only

DAMAGES = [
    Damage("valid video", "dataset_video", None, None),
    Damage("valid images", "dataset_images", None, None),
    Damage("valid tiny", "dataset_tiny", None, None),
    Damage("valid channel-first", "dataset_channel_first", None, None),
    Damage(
        "valid channel-first, stats flat",
        "dataset_channel_first",
        _json("meta/stats.json", _set(FRONT, "mean", [0.5, 0.5, 0.5])),
        None,
    ),
    # meta/info.json
    Damage(
        "fps 0",
        "dataset_video",
        _json("meta/info.json", _set("fps", 0)),
        r"info.json: fps is 0, not a number in \(0, 1000\]",
    ),
    Damage(
        "fps NaN",
        "dataset_video",
        _json("meta/info.json", _set("fps", math.nan)),
        r"fps is nan, not a number",
    ),
    Damage(
        "fps huge", "dataset_tiny", _json("meta/info.json", _set("fps", 1e9)), r"fps is 1000000000.0, not"
    ),
    Damage("fps a string", "dataset_tiny", _json("meta/info.json", _set("fps", "10")), r"fps is '10', not"),
    Damage(
        "camera 100000x100000",
        "dataset_video",
        _json("meta/info.json", _set("features", TOP, "shape", [100000, 100000, 3])),
        r"feature 'observation.images.top' declares shape \[100000, 100000, 3\] .* raise --dataset.max_feature_size",
    ),
    Damage(
        "negative shape",
        "dataset_tiny",
        _json("meta/info.json", _set("features", "observation.state", "shape", [-4])),
        r"'observation.state' has shape \[-4\], not a list of positive integers",
    ),
    Damage(
        "camera of two dimensions",
        "dataset_images",
        _json("meta/info.json", _set("features", TOP, "shape", [24, 40])),
        r"'observation.images.top' has shape \[24, 40\]; an image or video is \[height, width, channels\]",
    ),
    Damage(
        "camera names not a layout",
        "dataset_channel_first",
        _json("meta/info.json", _set("features", FRONT, "names", ["width", "height", "channels"])),
        r"feature 'observation.images.front' has names \['width', 'height', 'channels'\], not an image "
        r"layout; set them to \[\"height\", \"width\", \"channels\"\] or \[\"channels\", \"height\", \"width\"\]",
    ),
    Damage(
        "channel-first image without names",
        "dataset_channel_first",
        _json("meta/info.json", _set("features", FRONT, "names", None)),
        r"images.front( \(episode 0, index 0\): the image declares 8x8 pixels, meta/info.json says 3x8,|"
        r"\.mean is .*, not 8 finite numbers \(one per channel, flat or \(8, 1, 1\):) its shape \[3, 8, 8\] "
        r"read as \[height, width, channels\].* fix meta/info.json's shape or names",
        NOT_INFO,
    ),
    Damage(
        "channel-first video named channel-last",
        "dataset_channel_first",
        _json("meta/info.json", _set("features", SIDE, "names", ["height", "width", "channels"])),
        r"(file-000.mp4: frames are 16x32, meta/info.json says observation.images.side is 3x16 \(episode 0\),|"
        r"images.side.mean is .*, not 32 finite numbers \(one per channel, flat or \(32, 1, 1\):) its shape "
        r"\[3, 16, 32\] read as \[height, width, channels\].* fix meta/info.json's shape or names",
        NOT_INFO,
    ),
    Damage(
        "camera key with ../",
        "dataset_video",
        _json("meta/info.json", _rename_camera),
        r"camera key 'observation.images.../../top' holds a path separator",
    ),
    Damage("video_path ../outside", "dataset_video", _videos_outside, OUTSIDE, NOT_INFO),
    Damage(
        "video_path attribute access",
        "dataset_video",
        _template("videos/{video_key.__class__}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"),
        r"uses \{video_key.__class__\}; only video_key, chunk_index, file_index",
    ),
    Damage(
        "video_path index access",
        "dataset_video",
        _template("videos/{video_key}/chunk-{chunk_index[0]}/file-{file_index:03d}.mp4"),
        r"uses \{chunk_index\[0\]\}",
    ),
    Damage(
        "video_path huge width",
        "dataset_video",
        _template("videos/{video_key}/chunk-{chunk_index:999999999d}/f.mp4"),
        r"uses \{chunk_index:999999999d\}",
    ),
    Damage(
        "video_path unbalanced",
        "dataset_video",
        _template("videos/{video_key"),
        r"video_path 'videos/\{video_key' is not a format string",
    ),
    Damage(
        "data_path unknown key",
        "dataset_tiny",
        _json("meta/info.json", _set("data_path", "data/{episode_index}.parquet")),
        r"data_path .* uses \{episode_index\}; only chunk_index, file_index",
    ),
    Damage(
        "info.json a symlink to /etc/passwd",
        "dataset_tiny",
        _replace_file("meta/info.json", lambda p: p.symlink_to("/etc/passwd")),
        OUTSIDE,
        local_only=True,
    ),
    Damage(
        "info.json a FIFO",
        "dataset_tiny",
        _replace_file("meta/info.json", os.mkfifo),
        r"info.json: the metadata file is a FIFO",
        local_only=True,
    ),
    # meta/stats.json
    Damage(
        "stats mean NaN",
        "dataset_video",
        _json("meta/stats.json", _set("observation.state", "mean", [math.nan] * 4)),
        r"stats.json: observation.state.mean is \[nan, nan, nan, nan\], not 4 finite numbers",
        TRAINING_ONLY,
    ),
    Damage(
        "stats std of the wrong length",
        "dataset_tiny",
        _json("meta/stats.json", _set("action", "std", [1.0])),
        r"action.std is \[1.0\], not 2 finite numbers",
        TRAINING_ONLY,
    ),
    Damage(
        "camera stats of two channels",
        "dataset_channel_first",
        _json("meta/stats.json", _set(FRONT, "std", [[[0.5]], [[0.5]]])),
        r"stats.json: observation.images.front.std is \[\[\[0.5\]\], \[\[0.5\]\]\], not 3 finite numbers "
        r"\(one per channel, flat or \(3, 1, 1\): its shape \[3, 8, 8\] read as \[channels, height, width\]",
        TRAINING_ONLY,
    ),
    Damage(
        "stats std 0 (floored)",
        "dataset_tiny",
        _json("meta/stats.json", _set("action", "std", [0.0, 1.0])),
        None,
    ),
    # the episodes metadata
    Damage(
        "from_timestamp NaN",
        "dataset_video",
        _column(EPISODES, f"videos/{TOP}/from_timestamp", _row(0, math.nan)),
        r"episode 0 of observation.images.top has from_timestamp nan",
        NOT_INFO,
    ),
    Damage(
        "from_timestamp beyond the video",
        "dataset_video",
        _both(
            _column(EPISODES, f"videos/{TOP}/from_timestamp", _row(0, 100.0)),
            _column(EPISODES, f"videos/{TOP}/to_timestamp", _row(0, 102.0)),
        ),
        r"the video lasts .* needs a frame at",
        NOT_INFO,
    ),
    Damage(
        "file_index missing",
        "dataset_video",
        _column(EPISODES, f"videos/{TOP}/file_index", _row(1, None)),
        r"videos/observation.images.top/file_index of row 1 \(episode 1\) is nan, not an index",
        NOT_INFO,
        episode=1,
    ),
    Damage(
        "dataset_to_index missing",
        "dataset_tiny",
        _column(EPISODES, "dataset_to_index", _row(0, None)),
        r"dataset_to_index of row 0 \(episode 0\) is nan",
    ),
    Damage(
        "episodes parquet garbage",
        "dataset_tiny",
        _replace_file(EPISODES, lambda p: p.write_bytes(b"PAR1garbage")),
        r"is not a readable parquet file",
    ),
    # videos
    Damage(
        "video truncated",
        "dataset_video",
        _truncate(TOP_VIDEO, 0.5),
        re.escape(TOP_VIDEO)
        + r": (no frame within|cannot decode the frame at) .* for episode \d+, index \d+",
        NOT_INFO,
        episode=2,
    ),
    Damage(
        "video empty",
        "dataset_video",
        _truncate(TOP_VIDEO, 0),
        r"file-000.mp4: not a readable video",
        NOT_INFO,
    ),
    Damage(
        "mp4 without a video stream",
        "dataset_video",
        _replace_file(TOP_VIDEO, _audio_only_mp4),
        r"file-000.mp4: holds no video stream",
        NOT_INFO,
    ),
    Damage(
        "video a symlink to /etc/passwd",
        "dataset_video",
        _replace_file(TOP_VIDEO, lambda p: p.symlink_to("/etc/passwd")),
        OUTSIDE,
        NOT_INFO,
        local_only=True,
    ),
    Damage(
        "video a symlink outside the root",
        "dataset_video",
        _outside_copy(TOP_VIDEO),
        OUTSIDE,
        NOT_INFO,
        local_only=True,
    ),
    Damage(
        "video a FIFO",
        "dataset_video",
        _replace_file(TOP_VIDEO, os.mkfifo),
        r"file-000.mp4: the video of observation.images.top is a FIFO",
        NOT_INFO,
        local_only=True,
    ),
    Damage(
        "video a directory",
        "dataset_video",
        _replace_file(TOP_VIDEO, Path.mkdir),
        r"is a directory",
        NOT_INFO,
        local_only=True,
    ),
    # data files
    Damage(
        "state NaN",
        "dataset_tiny",
        _column(DATA, "observation.state", _vector_row(3, 1, math.nan)),
        r"episode 0, frame 3: observation.state holds NaN or inf",
        NOT_INFO,
    ),
    Damage(
        "action inf",
        "dataset_tiny",
        _column(DATA, "action", _vector_row(25, 0, math.inf)),
        r"episode 1, frame 5: action holds NaN or inf",
        NOT_INFO,
        episode=1,
    ),
    Damage(
        "data file a symlink outside the root",
        "dataset_tiny",
        _outside_copy(DATA),
        OUTSIDE,
        NOT_INFO,
        local_only=True,
    ),
    Damage(
        "data file truncated",
        "dataset_tiny",
        _truncate(DATA, 0.5),
        r"file-000.parquet is not a readable parquet file",
        NOT_INFO,
    ),
    # images
    Damage(
        "PNG declaring 40000x40000",
        "dataset_images",
        _column(DATA, TOP, _row(0, {"bytes": _png_header(40000, 40000), "path": None})),
        r"\(episode 0, index 0\): Image size \(1600000000 pixels\) exceeds limit",
        NOT_INFO,
    ),
    Damage(
        "PNG declaring 12000x12000",
        "dataset_images",
        _column(DATA, TOP, _row(0, {"bytes": _png_header(12000, 12000), "path": None})),
        r"\(episode 0, index 0\): the image declares 12000x12000 pixels, meta/info.json says 24x40",
        NOT_INFO,
    ),
    Damage(
        "images holding only a path",
        "dataset_images",
        _column(DATA, TOP, _images(lambda i, v: {"bytes": None, "path": "x.png"})),
        r"the image column holds no bytes",
        NOT_INFO,
    ),
    Damage(
        "garbage images found in the workers",
        "dataset_images",
        _column(DATA, TOP, _images(_garbage_after_first)),
        r"observation.images.top \(episode \d+, index \d+\): the image bytes do not decode",
        NOT_INFO,
    ),
]


@pytest.fixture(scope="module")
def damaged(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Damage], Path]:
    """The damaged copy of each case, made once for all readers."""
    made: dict[str, Path] = {}

    def make(damage: Damage) -> Path:
        if damage.name not in made:
            where = tmp_path_factory.mktemp("damaged")
            root = copy_fixture(where, "lerobot", damage.fixture)
            if damage.apply is not None:
                damage.apply(root)
            made[damage.name] = root
        return made[damage.name]

    return make


@pytest.fixture(scope="module")
def uploaded(s3_server, damaged) -> Iterator[Callable[[Damage], str]]:
    """The damaged copy of each case uploaded once to one bucket of the S3 test server: its URL."""
    import fsspec

    store = fsspec.filesystem("s3", use_listings_cache=False)
    bucket = f"hostile-{uuid.uuid4().hex[:12]}"
    store.mkdir(bucket)
    made: dict[str, str] = {}

    def upload(damage: Damage) -> str:
        if damage.name not in made:
            url = f"s3://{bucket}/{len(made)}/{damage.fixture}"
            store.put(f"{damaged(damage)}/", url, recursive=True)
            made[damage.name] = url
        return made[damage.name]

    yield upload
    store.rm(bucket, recursive=True)


def _cases(streamed: bool) -> list:
    return [
        pytest.param(damage, reader, id=f"{damage.name}-{reader.name}")
        for damage in DAMAGES
        for reader in READERS
        if reader.streamed == streamed and not (streamed and damage.local_only)
    ]


@pytest.mark.parametrize(("damage", "reader"), _cases(streamed=False))
def test_every_reader_ends_a_damaged_dataset_in_one_line(
    damage: Damage, reader: Reader, damaged, tmp_path, capsys, clean_accelerate
) -> None:
    _ends_in_one_line(damage, reader, str(damaged(damage)), tmp_path, capsys)


@pytest.mark.parametrize(("damage", "reader"), _cases(streamed=True))
def test_every_streamed_reader_ends_a_damaged_copy_on_s3_in_one_line(
    damage: Damage, reader: Reader, uploaded, tmp_path, capsys, clean_accelerate
) -> None:
    """The same cases read in place from the S3 test server (`uploaded`, set up before
    `clean_accelerate` saves the environment that holds the server's endpoint and credentials)."""
    _ends_in_one_line(damage, reader, uploaded(damage), tmp_path, capsys)


def _ends_in_one_line(damage: Damage, reader: Reader, root: str, work: Path, capsys) -> None:
    code, err = reader.read(root, work, damage.episode, reader.streamed, capsys)
    if damage.line is None or reader.local in damage.passes:
        assert code == 0, err
        return
    errors = [line for line in err.splitlines() if line.startswith("error")]
    assert code == 1 and len(errors) == 1 and err.splitlines()[-1] == errors[0], (
        err
    )  # a run's banner may precede it
    assert re.search(damage.line, errors[0]), errors[0]
    assert "Traceback" not in err and "root:x:0:0" not in err  # nothing of /etc/passwd is echoed


def test_a_floored_std_and_skipped_episodes_are_in_the_banner(
    damaged, tmp_path, capsys, clean_accelerate
) -> None:
    """std 0 trains with a warning; --dataset.skip_nonfinite trains without the NaN episode and says so."""
    from accelerate.state import AcceleratorState

    def train(damage: str, output_dir: Path, *extra: str) -> str:
        root = damaged(next(d for d in DAMAGES if d.name == damage))
        args = ["train", f"--dataset.root={root}", "--policy.type=mlp", "--steps=1", "--batch_size=8"]
        code, err = _cli([*args, *extra, f"--output_dir={output_dir}"], capsys)
        AcceleratorState._reset_state(reset_partial_state=True)
        assert code == 0, err
        return (output_dir / "metrics.jsonl").read_text()  # its first record holds the banner

    banner = train("stats std 0 (floored)", tmp_path / "a")
    assert re.search(r"warning: \S+stats.json: action.std is <= 0 at \[0\]; floored to 1e-06", banner)
    banner = train("state NaN", tmp_path / "b", "--dataset.skip_nonfinite=true")
    assert "--dataset.skip_nonfinite: skipped 1 of 2 episodes holding NaN or inf (0)" in banner
    # in a mixture, each member's lines reach the banner, named by member
    nan_root = damaged(next(d for d in DAMAGES if d.name == "state NaN"))
    args = ["train", "--dataset.repo_id=[local/a,local/b]", f"--dataset.root=[{nan_root},{nan_root}]"]
    extra = ["--dataset.skip_nonfinite=true", "--policy.type=mlp", "--steps=1", "--batch_size=8"]
    code, err = _cli([*args, *extra, f"--output_dir={tmp_path / 'c'}"], capsys)
    assert code == 0, err
    banner = (tmp_path / "c" / "metrics.jsonl").read_text()
    for member in ("local/a", "local/b"):
        assert f"{member}: --dataset.skip_nonfinite: skipped 1 of 2 episodes" in banner, banner[:2000]


# A child that opens a damaged copy and reports its peak memory against opening the valid fixture: a
# declared 100000x100000 camera or a 1.6 G-pixel PNG must allocate nothing.
_PEAK = """
import json, sys
from trainer.data.sources.lerobot import open_dataset
from trainer.errors import TrainerError
open_dataset(root=sys.argv[1])[0]
base = peak_kib()
try:
    dataset = open_dataset(root=sys.argv[2])
    dataset[0]
    line = ""
except TrainerError as exc:
    line = str(exc)
print(json.dumps({"growth_kib": peak_kib() - base, "line": line}))
"""


@pytest.mark.parametrize(
    "name, size",
    [
        ("camera 100000x100000", None),
        ("PNG declaring 40000x40000", None),
        ("PNG with 12000x12000 pixels", (12000, 12000)),
    ],
)
def test_a_declared_huge_frame_allocates_nothing(name, size, damaged, tmp_path) -> None:
    if size is None:
        root = damaged(next(d for d in DAMAGES if d.name == name))
    else:  # real pixel data this time: a decoder would allocate and fill 144 M pixels
        root = copy_fixture(tmp_path, "lerobot", "dataset_images")
        _column(DATA, TOP, _row(0, {"bytes": _png_header(*size, pixels=True), "path": None}))(root)
    valid = copy_fixture(
        tmp_path / "valid", "lerobot", "dataset_video" if "camera" in name else "dataset_images"
    )
    result = run_child(_PEAK, str(valid), str(root))
    assert result["line"] and result["growth_kib"] < 20 * 1024, result


@pytest.mark.distributed
@pytest.mark.parametrize("name", ["fps NaN", "garbage images found in the workers"])
def test_two_ranks_end_in_one_line_each_in_bounded_time(name, damaged, tmp_path, monkeypatch) -> None:
    """2 gloo ranks with 2 workers each: a damage found at open and one found in the workers end every
    rank with the case's line, no traceback, well within the launch's timeout."""
    from helpers.launch import no_traceback_from_us, run_torchrun

    tests = Path(__file__).resolve().parents[1]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tests), os.environ.get("PYTHONPATH", "")]))
    damage = next(d for d in DAMAGES if d.name == name)
    args = [f"--dataset.root={damaged(damage)}", f"--policy.type={CAMERA_POLICY}", "--num_workers=2"]
    args += ["--steps=4", "--batch_size=4", "--collective_timeout_s=60", f"--output_dir={tmp_path / 'run'}"]
    started = time.monotonic()
    done = run_torchrun(tests / "distributed/scripts/train_cli.py", 2, *args, timeout=180, check=False)
    errors = [line for line in done.stdout.splitlines() if line.startswith("error: ")]
    assert done.returncode != 0 and no_traceback_from_us(done.stdout), done.stdout
    # the main rank's line; the other rank's too unless the launcher stopped it before it printed
    assert 1 <= len(errors) <= 2 and all(re.search(damage.line, line) for line in errors), done.stdout
    assert time.monotonic() - started < 120
