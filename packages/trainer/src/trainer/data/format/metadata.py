"""Reading a LeRobotDataset v3.0 from disk: metadata, statistics and the frames of chosen episodes.

The format keeps `meta/info.json` (features, fps, totals), `meta/stats.json` (per-feature statistics),
`meta/episodes/chunk-*/file-*.parquet` (one row per episode: its `[dataset_from_index,
dataset_to_index)` frame range) and `data/chunk-*/file-*.parquet` (one row per frame, its global
`index`; a file holds several episodes and an episode may continue in the next file).

Parquet files are opened memory-mapped and read column by column: first only `index`, to find which
rows belong to the chosen episodes, then only the feature columns the run uses, and only from files
that hold such rows. Image columns are read only when a run uses that camera (their PNG/JPEG bytes,
decoded per sample by `decode.py`); video files are described by the episodes metadata
(`read_video_places`) and decoded per sample.

Every reader checks what it read with `validate.py` before returning it, and opens only regular files
inside the dataset root. The root is a local directory or, streamed, a URL (`files.py`): the same
readers read both, pyarrow fetching only the footer and the chosen columns of a remote file.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainer.data.format import validate
from trainer.data.format.files import DatasetPath, matching, source
from trainer.data.format.remote import StreamError
from trainer.errors import ConfigError

CODEBASE_VERSION = "v3.0"
VISUAL_DTYPES = ("image", "video")
FLOAT_DTYPES = ("float16", "float32", "float64")
INDEX_COLUMN = "index"
VIDEO_PATH = validate.DEFAULT_TEMPLATES["video_path"]
CONVERT_HINT = (
    "convert it with LeRobot's `python -m lerobot.datasets.v30.convert_dataset_v21_to_v30 --repo-id=ID`"
)


@dataclass(frozen=True)
class Info:
    """`meta/info.json`, the parts the trainer reads."""

    root: DatasetPath
    fps: float
    features: dict[str, dict[str, Any]]
    video_path: str = VIDEO_PATH

    def is_float_vector(self, name: str) -> bool:
        feature = self.features[name]
        return feature.get("dtype") in FLOAT_DTYPES and len(feature.get("shape") or [1]) == 1

    @property
    def observation_features(self) -> list[str]:
        """Float vector `observation.*` features, in the order info.json lists them."""
        return [n for n in self.features if n.startswith("observation.") and self.is_float_vector(n)]

    @property
    def visual_features(self) -> list[str]:
        return [n for n, f in self.features.items() if f.get("dtype") in VISUAL_DTYPES]

    @property
    def cameras(self) -> list[str]:
        """Every image/video feature, whatever its name: LeRobot knows a camera by its dtype
        (`observation.image` in its PushT datasets, `observation.images.<name>` elsewhere)."""
        return self.visual_features

    def camera_shape(self, name: str) -> tuple[int, int, int]:
        """(C, H, W) of a camera, from info.json's `shape` in the layout its `names` declare:
        (H, W, C) or (C, H, W) (validate.camera_layout). The frames are (C, H, W) either way."""
        feature = self.features[name]
        layout = validate.camera_layout(self.root / "meta" / "info.json", name, feature)
        sizes = dict(zip(layout, (int(v) for v in feature["shape"]), strict=True))
        return sizes["channels"], sizes["height"], sizes["width"]

    def camera_reading(self, name: str) -> str:
        """How a camera's shape was read, for the line that finds frames of another size."""
        feature = self.features[name]
        layout = validate.camera_layout(self.root / "meta" / "info.json", name, feature)
        return f"its shape {feature['shape']} read as [{', '.join(layout)}]"

    def size(self, name: str) -> int:
        return int(np.prod(self.features[name].get("shape") or [1]))


def read_info(root: DatasetPath, max_feature_size: int = validate.MAX_FEATURE_SIZE) -> Info:
    """The dataset's metadata, every field checked (validate.check_info); a missing file or another
    codebase version is one ConfigError."""
    path = validate.inside_root(root, root / "meta" / "info.json", "metadata file")
    if not path.is_file():
        raise ConfigError(
            f"{root} has no meta/info.json, so it is not a LeRobotDataset: point --dataset.root at the "
            "directory holding meta/ and data/"
        )
    data = _read_json(path)
    version = data.get("codebase_version")
    if version != CODEBASE_VERSION:
        raise ConfigError(
            f"{root} is a LeRobotDataset {version}; the trainer reads {CODEBASE_VERSION}: {CONVERT_HINT}"
        )
    features = data.get("features")
    if not isinstance(features, dict) or "action" not in features:
        raise ConfigError(f"{path} lists no `action` feature; the trainer needs it as the training target")
    validate.check_info(path, data, max_feature_size)
    video_path = str(data.get("video_path") or VIDEO_PATH)
    return Info(root=root, fps=float(data["fps"]), features=features, video_path=video_path)


def read_stats(info: Info) -> tuple[dict[str, dict[str, np.ndarray]], list[str]]:
    """`meta/stats.json`'s mean/std of the float vectors (their size) and cameras (per channel), checked
    (validate.check_stats), with a warning line per std floored; ({}, []) when the dataset has none
    (the statistics are then computed)."""
    path = validate.inside_root(info.root, info.root / "meta" / "stats.json", "metadata file")
    if not path.is_file():
        return {}, []
    sizes = {n: info.size(n) for n in info.features if info.is_float_vector(n)}
    sizes.update({n: info.camera_shape(n)[0] for n in info.cameras})
    readings = {n: info.camera_reading(n) for n in info.cameras}
    return validate.check_stats(path, _read_json(path), sizes, readings)


def read_episode_ranges(root: DatasetPath) -> dict[int, tuple[int, int]]:
    """Episode index -> `[from, to)` global frame range, from the episodes metadata."""
    files = matching(root / "meta" / "episodes", "chunk-*/file-*.parquet")
    if not files:
        raise ConfigError(f"{root} has no meta/episodes/chunk-*/file-*.parquet; the dataset is incomplete")
    ranges: dict[int, tuple[int, int]] = {}
    for path in files:
        columns = _read_columns(path, ["episode_index", "dataset_from_index", "dataset_to_index"], root=root)
        validate.check_ranges(path, *columns.values())
        for episode, start, end in zip(*(columns[c].tolist() for c in columns), strict=True):
            ranges[int(episode)] = (int(start), int(end))
    return ranges


@dataclass(frozen=True)
class VideoPlace:
    """Where one episode's frames of one camera are: its file and the file time of its first frame."""

    path: DatasetPath
    from_timestamp: float


def read_video_places(info: Info, key: str) -> dict[int, VideoPlace]:
    """Episode index -> the video file (per info.json's `video_path`) and start time of camera `key`;
    the rows are checked (validate.check_video_rows) and every file is a regular file inside the root."""
    prefix = f"videos/{key}/"
    names = ("chunk_index", "file_index", "from_timestamp", "to_timestamp")
    columns = ["episode_index", *(prefix + c for c in names)]
    places: dict[int, VideoPlace] = {}
    files: dict[tuple[int, int], DatasetPath] = {}
    for path in matching(info.root / "meta" / "episodes", "chunk-*/file-*.parquet"):
        values = _read_columns(path, columns, root=info.root)
        validate.check_video_rows(path, key, values)
        for episode, chunk, file, start, _ in zip(*(values[c].tolist() for c in columns), strict=True):
            where = (int(chunk), int(file))
            if where not in files:
                relative = info.video_path.format(video_key=key, chunk_index=where[0], file_index=where[1])
                files[where] = validate.inside_root(info.root, info.root / relative, f"video of {key}")
            places[int(episode)] = VideoPlace(files[where], float(start))
    return places


def read_tasks(root: DatasetPath) -> dict[int, str]:
    """`meta/tasks.parquet`: task index -> the task's text ({} when the dataset has none)."""
    path = root / "meta" / "tasks.parquet"
    if not path.is_file():
        return {}
    values = _read_columns(path, ["task_index", "task"], root=root)
    return {
        int(i): str(t) for i, t in zip(values["task_index"].tolist(), values["task"].tolist(), strict=True)
    }


def read_episode_tasks(root: DatasetPath) -> dict[int, tuple[str, ...]]:
    """Episode index -> its tasks, from the episodes metadata's `tasks` column; a dataset whose
    metadata has none is one task (every episode maps to ())."""
    tasks: dict[int, tuple[str, ...]] = {}
    for path in matching(root / "meta" / "episodes", "chunk-*/file-*.parquet"):
        names = ["episode_index", "tasks"]
        validate.inside_root(root, path, "episodes metadata file")
        if "tasks" not in _parquet(path).schema_arrow.names:
            names = names[:1]
        columns = _read_columns(path, names, root=root)
        listed = columns.get("tasks", [()] * len(columns["episode_index"]))
        for episode, episode_tasks in zip(columns["episode_index"].tolist(), listed, strict=True):
            tasks[int(episode)] = tuple(str(task) for task in episode_tasks)
    return tasks


def read_frames(
    info: Info, episodes: Sequence[int], ranges: dict[int, tuple[int, int]], columns: Sequence[str]
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The chosen `columns` of `episodes`' frames in global frame order (float features as float32
    frames x size, integer columns as int64, image columns as their encoded bytes), and each episode's
    length in the same order."""
    by_start = sorted(episodes, key=lambda e: ranges[e][0])
    starts = np.array([ranges[e][0] for e in by_start], dtype=np.int64)
    ends = np.array([ranges[e][1] for e in by_start], dtype=np.int64)
    parts: dict[str, list[np.ndarray]] = {name: [] for name in columns}
    indices: list[np.ndarray] = []
    for path in matching(info.root / "data", "chunk-*/file-*.parquet"):
        index = _read_columns(path, [INDEX_COLUMN], root=info.root)[INDEX_COLUMN]
        slot = np.searchsorted(starts, index, side="right") - 1
        wanted = (slot >= 0) & (index < ends[np.maximum(slot, 0)])
        if not wanted.any():
            continue
        values = _read_columns(path, list(columns), root=info.root, info=info)
        every = bool(wanted.all())  # the usual case: no copy of a whole file's rows
        for name in columns:
            parts[name].append(values[name] if every else values[name][wanted])
        indices.append(index if every else index[wanted])
    found = np.concatenate(indices) if indices else np.zeros(0, dtype=np.int64)
    order = None if bool(np.all(found[1:] > found[:-1])) else np.argsort(found, kind="stable")
    distinct = len(found) if order is None else len(np.unique(found))
    expected = int((ends - starts).sum())
    if distinct != expected or len(found) != expected:
        raise ConfigError(
            f"{info.root}: the data files hold {distinct} of the {expected} frames the episodes metadata lists "
            "for the chosen episodes; the dataset is incomplete, re-download or re-write it"
        )
    frames = {name: _joined(parts[name], order) for name in columns}
    return frames, ends - starts


def _joined(parts: list[np.ndarray], order: np.ndarray | None) -> np.ndarray:
    """The parts in global frame order: as read when the files are in order (the usual case)."""
    joined = parts[0] if len(parts) == 1 else np.concatenate(parts)
    return joined if order is None else joined[order]


def _read_columns(
    path: DatasetPath, names: list[str], *, root: DatasetPath, info: Info | None = None
) -> dict[str, np.ndarray]:
    """Only `names`, from a memory-mapped parquet file (a regular file inside `root`); vectors as float32 (rows x size) when `info` gives their shape, else the column's own dtype."""
    validate.inside_root(root, path, "parquet file")
    table = _parquet(path, names)
    missing = [n for n in names if n not in table.column_names]
    if missing:
        raise ConfigError(f"{path} has no column {missing[0]!r}; the dataset is incomplete or not v3.0")
    return {name: _to_numpy(table.column(name), path, name, info) for name in names}


def _parquet(path: DatasetPath, names: list[str] | None = None) -> Any:
    """The parquet file at `path` (memory-mapped when local), or, given `names`, those columns as a
    table; a truncated or damaged file is one ConfigError naming it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(source(path), memory_map=True)
        return parquet if names is None else parquet.read(columns=names)
    except StreamError:
        raise
    except (pa.ArrowException, OSError) as exc:
        raise ConfigError(
            f"{path} is not a readable parquet file ({' '.join(str(exc).split())[:160]}): it is truncated or "
            "damaged; re-download or re-write the dataset"
        ) from None


def _to_numpy(column: Any, path: DatasetPath, name: str, info: Info | None) -> np.ndarray:
    import pyarrow as pa

    column = column.combine_chunks()
    if info is None:
        return column.to_numpy(zero_copy_only=False)
    dtype = info.features[name].get("dtype")
    if dtype == "image":  # the {"bytes", "path"} struct: the encoded bytes, decoded per sample
        return column.field("bytes").to_numpy(zero_copy_only=False)
    if str(dtype).startswith("int"):
        return column.to_numpy(zero_copy_only=False).astype(np.int64, copy=False).reshape(-1)
    size = info.size(name)
    flat = (
        column.flatten()
        if pa.types.is_list(column.type) or pa.types.is_fixed_size_list(column.type)
        else column
    )
    values = flat.to_numpy(zero_copy_only=False)
    if values.size != len(column) * size:
        raise ConfigError(
            f"{path}: column {name!r} does not hold {size} values per frame as meta/info.json says"
        )
    return values.astype(np.float32, copy=False).reshape(len(column), size)


def _read_json(path: DatasetPath) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read it as JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return data
