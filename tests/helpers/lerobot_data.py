"""LeRobotDatasets v3.0 of a chosen shape, written with pyarrow as LeRobot lays them out.

The frames follow learnable dynamics: the state turns by a fixed rotation each step and the action
is a fixed linear map of the state, so a chunk of future actions is a function of the present
observation. Frames are cut into data files of `rows_per_file` rows across two chunk directories,
so episodes span files and files hold several episodes. Each frame also carries a camera, an image
column of 4 x 4 PNG frames as LeRobot's writer stores them, which a state-only policy never reads.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

IMAGE = "observation.images.front"
STATE, VELOCITY = "observation.state", "observation.velocity"
FEATURES = {
    STATE: {"dtype": "float32", "shape": [4], "names": ["x0", "y0", "x1", "y1"]},
    IMAGE: {"dtype": "image", "shape": [4, 4, 3], "names": ["height", "width", "channels"]},
    VELOCITY: {"dtype": "float32", "shape": [2], "names": ["v0", "v1"]},
    "action": {"dtype": "float32", "shape": [2], "names": ["a0", "a1"]},
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}


def frames(episode_lengths: list[int], seed: int = 0) -> dict[str, np.ndarray]:
    """Every frame's columns, in global index order."""
    rng = np.random.default_rng(seed)
    turn = np.array([[np.cos(0.3), -np.sin(0.3)], [np.sin(0.3), np.cos(0.3)]])
    states, episode, frame = [], [], []
    for e, length in enumerate(episode_lengths):
        point = rng.uniform(-2, 2, size=(2, 2))  # two 2-D points turning at the same rate
        for t in range(length):
            states.append(point.reshape(-1).copy())
            point = point @ turn.T
            episode.append(e)
            frame.append(t)
    state = np.asarray(states, dtype=np.float32)
    velocity = np.stack([state[:, 0] - state[:, 2], state[:, 1] + state[:, 3]], axis=1).astype(np.float32)
    action = np.stack([state[:, 0] + 0.5 * state[:, 3], state[:, 1] - state[:, 2]], axis=1).astype(np.float32)
    return {
        STATE: state,
        VELOCITY: velocity,
        "action": action,
        "episode_index": np.asarray(episode, dtype=np.int64),
        "frame_index": np.asarray(frame, dtype=np.int64),
        "index": np.arange(len(state), dtype=np.int64),
    }


def write_dataset(
    root: Path,
    episode_lengths: list[int],
    rows_per_file: int = 37,
    seed: int = 0,
    broken_images: bool = False,
    *,
    state_size: int = 4,
    action_size: int = 2,
    fps: int = 10,
) -> dict[str, np.ndarray]:
    """Write the dataset under `root`; returns the frames written (for comparisons). `broken_images`
    stores bytes that are not an image in the camera column. `state_size` (4 to 8) and `action_size`
    (2 to 4) widen the state and action with copies of their first values halved: another robot."""
    data = _widened(frames(episode_lengths, seed), state_size, action_size)
    total = len(data["index"])
    file_of_row = []
    for n, start in enumerate(range(0, total, rows_per_file)):
        chunk, file = divmod(n, 2)  # two files per chunk directory: several chunks too
        rows = slice(start, min(start + rows_per_file, total))
        file_of_row += [(chunk, file)] * (rows.stop - rows.start)
        path = root / f"data/chunk-{chunk:03d}/file-{file:03d}.parquet"
        _write_data_file(path, data, rows, broken_images, fps)
    ends = np.cumsum(episode_lengths)
    starts = ends - np.asarray(episode_lengths)
    episodes = pa.table(
        {
            "episode_index": pa.array(range(len(episode_lengths)), pa.int64()),
            "data/chunk_index": pa.array([file_of_row[s][0] for s in starts], pa.int64()),
            "data/file_index": pa.array([file_of_row[s][1] for s in starts], pa.int64()),
            "dataset_from_index": pa.array(starts, pa.int64()),
            "dataset_to_index": pa.array(ends, pa.int64()),
            "length": pa.array(episode_lengths, pa.int64()),
            "tasks": pa.array([["move"]] * len(episode_lengths), pa.list_(pa.string())),
        }
    )
    (root / "meta/episodes/chunk-000").mkdir(parents=True)
    pq.write_table(episodes, root / "meta/episodes/chunk-000/file-000.parquet")
    pq.write_table(pa.table({"task_index": [0], "task": ["move"]}), root / "meta/tasks.parquet")
    stats = {
        name: {"mean": data[name].mean(0).tolist(), "std": data[name].std(0).tolist(), "count": [total]}
        for name in (STATE, VELOCITY, "action")
    }
    (root / "meta/stats.json").write_text(json.dumps(stats))
    features = {
        **FEATURES,
        STATE: {**FEATURES[STATE], "shape": [state_size], "names": [f"s{i}" for i in range(state_size)]},
        "action": {
            **FEATURES["action"],
            "shape": [action_size],
            "names": [f"a{i}" for i in range(action_size)],
        },
    }
    info = {
        "codebase_version": "v3.0",
        "fps": fps,
        "features": features,
        "total_episodes": len(episode_lengths),
        "total_frames": total,
        "total_tasks": 1,
        "chunks_size": 1000,
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": None,
    }
    (root / "meta/info.json").write_text(json.dumps(info, indent=2))
    return data


def _png(index: int) -> bytes:
    """A 4 x 4 RGB frame as LeRobot's writer stores an image feature: PNG bytes (its colour from `index`)."""
    from PIL import Image

    pixels = np.full((4, 4, 3), int(index) % 256, dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def _widened(data: dict[str, np.ndarray], state_size: int, action_size: int) -> dict[str, np.ndarray]:
    for key, size in ((STATE, state_size), ("action", action_size)):
        values = data[key]
        data[key] = np.concatenate([values, 0.5 * values[:, : size - values.shape[1]]], axis=1)
    return data


def _write_data_file(
    path: Path, data: dict[str, np.ndarray], rows: slice, broken_images: bool, fps: int
) -> None:
    n = rows.stop - rows.start

    def vectors(values: np.ndarray, fixed: bool = False) -> pa.Array:
        """LeRobot's writer stores list<float>; fixed-size lists are read the same way."""
        flat, width = pa.array(values[rows].reshape(-1)), values.shape[1]
        if fixed:
            return pa.FixedSizeListArray.from_arrays(flat, width)
        return pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32) * width), flat)

    image = pa.array(
        [
            {"bytes": b"\x89PNG-cut" if broken_images else _png(data["index"][i]), "path": None}
            for i in range(rows.start, rows.stop)
        ],
        pa.struct([("bytes", pa.binary()), ("path", pa.string())]),
    )
    table = pa.table(
        {
            STATE: vectors(data[STATE]),
            IMAGE: image,
            VELOCITY: vectors(data[VELOCITY], fixed=True),
            "action": vectors(data["action"]),
            "timestamp": pa.array(data["frame_index"][rows] / float(fps), pa.float32()),
            "frame_index": pa.array(data["frame_index"][rows]),
            "episode_index": pa.array(data["episode_index"][rows]),
            "index": pa.array(data["index"][rows]),
            "task_index": pa.array(np.zeros(n, dtype=np.int64)),
        }
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
