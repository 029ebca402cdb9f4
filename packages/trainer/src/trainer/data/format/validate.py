"""Every field of a LeRobotDataset's metadata checked where it is read, before a decoder, a worker or
the model sees it; and every file opened as what it claims to be.

A dataset is input as hostile as a checkpoint: downloaded from the Hub or handed over by a colleague.
The readers of `metadata.py` call these checks on what they have just read, so one module says what a
valid dataset is: a finite, sane `fps`; features whose shapes are positive integers within
`--dataset.max_feature_size` values (a declared 100000x100000 camera is refused before anything is
allocated), an image's `names` one of its two layouts, (H, W, C) or (C, H, W); path templates that
use only their documented keys, with no attribute or index access, and land inside the dataset root;
camera keys without path separators; episode rows with finite times and every index present;
statistics that are finite, of the feature's length (a camera's: one per channel), with a positive
std (a non-positive one is floored to `STD_FLOOR`, and said so); regular files inside the root (never
a symlink out of it, a FIFO or a directory); no NaN or inf in a state or action frame.

Each violation is one ConfigError line naming the file, the field, the value and the fix.
"""

from __future__ import annotations

import math
import os
import re
import stat
import string
from collections.abc import Sequence
from typing import Any

import numpy as np

from trainer.data.format.files import DatasetPath, RemotePath, inside
from trainer.errors import ConfigError

MAX_FPS = 1000.0  # no robot camera or controller records faster; a larger fps is a corrupt field
MAX_FEATURE_SIZE = 2**26  # values of one frame of one feature: a 4K RGB camera holds 25M
STD_FLOOR = 1e-6  # a constant feature's std, floored so normalization never divides by zero
TEMPLATE_KEYS = {
    "video_path": ("video_key", "chunk_index", "file_index"),
    "data_path": ("chunk_index", "file_index"),
}
DEFAULT_TEMPLATES = {
    "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
    "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
}
CHANNELS_LAST = ("height", "width", "channels")  # an image's axes as LeRobot names them
CHANNELS_FIRST = ("channels", "height", "width")
_AXIS_SPELLINGS = {"channel": "channels"}  # LeRobot v2.0's ported datasets; LeRobot still reads it
_FORMAT_SPEC = re.compile(r"0?[0-9]?d?")  # `03d`, `d` or nothing: a short zero-padded integer
_REWRITE = "re-write the dataset with LeRobot or fix the field"


def check_info(path: DatasetPath, data: dict[str, Any], max_feature_size: int = MAX_FEATURE_SIZE) -> None:
    """`meta/info.json` (`data`, read from `path`): fps, every feature, the path templates."""
    check_fps(path, data.get("fps"))
    for name, feature in data["features"].items():
        _check_feature(path, name, feature, max_feature_size)
    for key in TEMPLATE_KEYS:
        if data.get(key) is not None:
            check_template(path, key, data[key])


def check_fps(path: DatasetPath, fps: Any) -> float:
    """A positive, finite fps of at most MAX_FPS."""
    if isinstance(fps, bool) or not isinstance(fps, int | float) or not 0 < fps <= MAX_FPS:
        raise ConfigError(
            f"{path}: fps is {fps!r}, not a number in (0, {MAX_FPS:g}]; set it to the rate the dataset was "
            "recorded at"
        )
    return float(fps)


def _check_feature(path: DatasetPath, name: Any, feature: Any, max_size: int) -> None:
    where = f"{path}: feature {name!r}"
    if not isinstance(feature, dict) or not isinstance(feature.get("dtype"), str):
        raise ConfigError(f"{where} is {_short(feature)}, not an object with a `dtype` string; {_REWRITE}")
    shape = feature.get("shape")
    if (
        not isinstance(shape, list)
        or not shape
        or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in shape)
    ):
        raise ConfigError(f"{where} has shape {shape!r}, not a list of positive integers; {_REWRITE}")
    size = math.prod(shape)
    if size > max_size:
        raise ConfigError(
            f"{where} declares shape {shape} ({size} values per frame), over the limit of {max_size}; "
            "raise --dataset.max_feature_size if the dataset really holds frames this large"
        )
    if feature["dtype"] in ("image", "video"):
        check_camera_key(path, name)
        if len(shape) != 3:  # a depth map's [height, width, 1] is listed too: refused only if a run asks
            raise ConfigError(
                f"{where} has shape {shape}; an image or video is [height, width, channels] or "
                f"[channels, height, width]; {_REWRITE}"
            )
        camera_layout(path, name, feature)


def camera_layout(path: DatasetPath, name: str, feature: dict[str, Any]) -> tuple[str, str, str]:
    """The axes of an image or video feature's `shape`, as its `names` declare them: CHANNELS_LAST or
    CHANNELS_FIRST (LeRobot's names; its older "channel" read as LeRobot reads it). Absent names are
    CHANNELS_LAST, the layout every writer used before LeRobot's channel-first cameras. Any other
    names are one ConfigError: reading the shape in a guessed layout would swap height and channels."""
    names = feature.get("names")
    if names is None:
        return CHANNELS_LAST
    if isinstance(names, list) and all(isinstance(n, str) for n in names):
        axes = tuple(_AXIS_SPELLINGS.get(n, n) for n in names)
        for layout in (CHANNELS_LAST, CHANNELS_FIRST):
            if axes == layout:
                return layout
    raise ConfigError(
        f"{path}: feature {name!r} has names {_short(names)}, not an image layout; set them to "
        f'["height", "width", "channels"] or ["channels", "height", "width"], as its shape '
        f"{feature.get('shape')} is laid out"
    )


def check_camera_key(path: DatasetPath, name: str) -> None:
    """A camera key names a directory of videos: no separators, no `..`, no NUL."""
    if any(part in name for part in ("/", "\\", "\0")) or name in (".", ".."):
        raise ConfigError(
            f"{path}: camera key {name!r} holds a path separator or is `.`/`..`; rename the feature "
            "(LeRobot's keys look like observation.images.top)"
        )


def check_template(path: DatasetPath, key: str, template: Any) -> None:
    """`video_path`/`data_path`: only TEMPLATE_KEYS[key] as plain fields (no `.attr`, no `[index]`, no
    conversion), each formatted at most as a short zero-padded integer."""
    allowed = TEMPLATE_KEYS[key]
    fix = f"use LeRobot's default, {DEFAULT_TEMPLATES[key]}"
    if not isinstance(template, str):
        raise ConfigError(f"{path}: {key} is {_short(template)}, not a string; {fix}")
    try:
        fields = [(f, spec, conv) for _, f, spec, conv in string.Formatter().parse(template) if f is not None]
    except ValueError as exc:
        raise ConfigError(f"{path}: {key} {_short(template)} is not a format string ({exc}); {fix}") from None
    for field, spec, conversion in fields:
        if field not in allowed or conversion is not None or not _FORMAT_SPEC.fullmatch(spec or ""):
            raise ConfigError(
                f"{path}: {key} {_short(template)} uses {{{field}{'!' + conversion if conversion else ''}"
                f"{':' + spec if spec else ''}}}; only {', '.join(allowed)} (formatted like :03d) may appear: {fix}"
            )


def inside_root(root: DatasetPath, path: DatasetPath, what: str) -> DatasetPath:
    """`path` (under `root`) if it is a regular file whose real location is inside the dataset root;
    a symlink out of the root, a FIFO, a device or a directory is one ConfigError (nothing is opened,
    so a FIFO never blocks). A missing file is left to the caller, which knows what it means. A
    streamed file (an object: no links, no FIFOs) must name a key under the root's."""
    if isinstance(path, RemotePath) or isinstance(root, RemotePath):
        if not inside(root, path):
            raise ConfigError(
                f"{path}: the {what} is outside the dataset root {root}; a dataset reads only its own files"
            )
        return path
    real_root = root.resolve()
    real = path.resolve()
    if real != real_root and real_root not in real.parents:
        raise ConfigError(
            f"{path}: the {what} resolves to {real}, outside the dataset root {real_root}; a dataset reads "
            "only its own files: copy the file into the dataset instead of linking it"
        )
    try:
        mode = os.stat(real).st_mode
    except FileNotFoundError:
        return path
    except OSError as exc:
        raise ConfigError(
            f"{path}: cannot stat the {what} ({exc.strerror}); re-download the dataset"
        ) from None
    if not stat.S_ISREG(mode):
        kind = (
            "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "not a regular file"
        )
        raise ConfigError(f"{path}: the {what} is {kind}; replace it with the file the dataset lists")
    return path


def check_ranges(path: DatasetPath, episodes: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
    """The episodes metadata's frame ranges: every value present, 0 <= from < to."""
    for column, values in (
        ("episode_index", episodes),
        ("dataset_from_index", starts),
        ("dataset_to_index", ends),
    ):
        _check_indices(path, column, episodes, values)
    bad = np.flatnonzero(starts >= ends)
    if bad.size:
        i = int(bad[0])
        raise ConfigError(
            f"{path}: episode {episodes[i]} has dataset_from_index {starts.tolist()[i]} >= dataset_to_index "
            f"{ends.tolist()[i]}; "
            f"an episode holds at least one frame: {_REWRITE}"
        )


def check_video_rows(path: DatasetPath, key: str, columns: dict[str, np.ndarray]) -> None:
    """One camera's columns of the episodes metadata: chunk and file indices present and non-negative,
    from/to timestamps finite with 0 <= from < to."""
    episodes = columns["episode_index"]
    for name in ("chunk_index", "file_index"):
        _check_indices(path, f"videos/{key}/{name}", episodes, columns[f"videos/{key}/{name}"])
    starts = _floats(columns[f"videos/{key}/from_timestamp"])
    ends = _floats(columns[f"videos/{key}/to_timestamp"])
    bad = np.flatnonzero(~(np.isfinite(starts) & np.isfinite(ends) & (starts >= 0) & (starts < ends)))
    if bad.size:
        i = int(bad[0])
        raise ConfigError(
            f"{path}: episode {episodes[i]} of {key} has from_timestamp {starts.tolist()[i]} and to_timestamp "
            f"{ends.tolist()[i]}; they must be finite with 0 <= from < to: {_REWRITE}"
        )


def _check_indices(path: DatasetPath, column: str, episodes: np.ndarray, values: np.ndarray) -> None:
    """An index column: every row an integer >= 0 (a null reads as None or NaN)."""
    numbers = _floats(values)
    bad = np.flatnonzero(~np.isfinite(numbers) | (numbers < 0) | (numbers != np.round(numbers)))
    if bad.size:
        i = int(bad[0])
        raise ConfigError(
            f"{path}: {column} of row {i} (episode {episodes[i]}) is {values.tolist()[i]!r}, not an index >= 0; "
            f"the metadata is damaged: {_REWRITE}"
        )


def _floats(values: np.ndarray) -> np.ndarray:
    """A column as float64, its nulls (None) as NaN."""
    if values.dtype == object:
        return np.array([np.nan if v is None else v for v in values.tolist()], dtype=np.float64)
    return values.astype(np.float64, copy=False)


# The statistics a feature may carry (LeRobot's stats.json; q01/q99 are pi0.5's QUANTILES bounds).
STAT_KEYS = ("mean", "std", "min", "max", "q01", "q99")


def check_stats(
    path: DatasetPath, stats: dict[str, Any], sizes: dict[str, int], cameras: dict[str, str] | None = None
) -> tuple[dict[str, dict[str, np.ndarray]], list[str]]:
    """`meta/stats.json`'s mean, std, min, max, q01 and q99 of the features in `sizes` (name -> values per frame: a vector's
    size, a camera's channels), as float arrays of that length; and one warning line per feature whose
    std has a value <= 0 (floored to STD_FLOOR). A camera's (`cameras`: name -> how its shape was read,
    for the error line) are one value per channel: flat, (C, 1, 1) as LeRobot writes them (nested
    lists) or any other shape of C values. Anything not finite or of another length is one ConfigError."""
    cameras = cameras or {}
    checked: dict[str, dict[str, np.ndarray]] = {}
    notes = []
    for name, size in sizes.items():
        entry = stats.get(name)
        if entry is None:
            continue
        if not isinstance(entry, dict):
            raise ConfigError(
                f"{path}: {name} is {_short(entry)}, not an object of statistics (mean, std, min, max); "
                "recompute the statistics with LeRobot (or delete the entry: the trainer then computes it)"
            )
        checked[name] = {}
        for key in STAT_KEYS:
            if key not in entry:
                continue
            try:
                values = np.asarray(entry[key], dtype=np.float64).reshape(-1)
            except (TypeError, ValueError):
                values = np.array([np.nan])
            if values.size != size or not np.isfinite(values).all():
                each, fix = "", ""
                if name in cameras:
                    each = f" (one per channel, flat or ({size}, 1, 1): {cameras[name]} in meta/info.json)"
                    fix = " or fix meta/info.json's shape or names"
                raise ConfigError(
                    f"{path}: {name}.{key} is {_short(entry[key])}, not {size} finite numbers{each}; recompute "
                    f"the statistics with LeRobot{fix} (or delete the entry: the trainer then computes it)"
                )
            checked[name][key] = values
        low = np.flatnonzero(checked[name].get("std", np.ones(1)) <= 0)
        if low.size:
            notes.append(
                f"warning: {path}: {name}.std is <= 0 at {low.tolist()[:8]}; floored to {STD_FLOOR:g} (a constant "
                "feature): recompute the statistics if it should vary"
            )
    return checked, notes


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def nonfinite_episodes(
    root: DatasetPath,
    columns: dict[str, np.ndarray],
    episodes: Sequence[int],
    ranges: dict[int, tuple[int, int]],
    skip: bool,
) -> list[int]:
    """The episodes holding a NaN or inf in any of the float `columns` (frames x size, as
    metadata.read_frames returns `episodes`' frames, by `ranges`). Unless `skip`
    (--dataset.skip_nonfinite), the first such frame is one ConfigError naming its episode, frame and
    feature: a NaN input would otherwise turn every loss after it into NaN, silently."""
    bad = {n: ~np.isfinite(values).all(axis=tuple(range(1, values.ndim))) for n, values in columns.items()}
    anywhere = np.logical_or.reduce(list(bad.values()))
    if not anywhere.any():
        return []
    by_start = sorted(episodes, key=lambda e: ranges[e][0])
    lengths = np.array([ranges[e][1] - ranges[e][0] for e in by_start])
    episode = np.repeat(by_start, lengths)
    if not skip:
        position = int(np.flatnonzero(anywhere)[0])
        name = next(n for n, rows in bad.items() if rows[position])
        frame = position - int((np.cumsum(lengths) - lengths)[by_start.index(int(episode[position]))])
        raise ConfigError(
            f"{root}: episode {int(episode[position])}, frame {frame}: {name} holds NaN or inf "
            f"({_short(columns[name][position].tolist())}); fix the recording, or pass "
            "--dataset.skip_nonfinite=true to train without the episodes holding such frames"
        )
    return sorted({int(e) for e in episode[anywhere]})
