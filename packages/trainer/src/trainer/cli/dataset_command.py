"""`trainer dataset info|show --dataset.root=PATH`: look at a LeRobotDataset before training on it.

`info` prints what a run would read: the features, each camera with its size and encoding, the
episodes, fps and the sizes on disk (`--json`: one JSON object); for a mixture (`--dataset.mixture=FILE`,
or `--dataset.repo_id='[a,b]'` / `--dataset.root='[ra,rb]'` with `--dataset.weights='[3,1]'`) each
member's, with its normalized weight and the episodes it trains on. `show --episode=N` writes a PNG: a strip
of each camera's frames (as the trainer decodes them) above the episode's state and action curves, so a
wrong camera, a frozen video or an action out of step with the images is seen before a run is spent.
`--dataset.streaming=true --dataset.root=s3://bucket/path` (or `hf://datasets/owner/name`, or a list of
URLs for a mixture) looks at a dataset in place, as a streamed run reads it. Data goes to stdout; errors are the trainer's one-line ConfigErrors.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainer.data.format import metadata as fmt
from trainer.data.format.cameras import LeRobotFrames
from trainer.data.format.files import DatasetPath, total_size
from trainer.data.sources.lerobot import LeRobotConfig
from trainer.data.sources.mixture import MixtureConfig
from trainer.errors import ConfigError

USAGE = (
    "usage: trainer dataset info --dataset.root=PATH|--dataset.repo_id=ID|--dataset.mixture=FILE [--json]\n"
    "       [--dataset.streaming=true --dataset.root=URL]\n"
    "       trainer dataset show --dataset.root=PATH|--dataset.repo_id=ID --episode=N [--output=FILE.png]"
)
STRIP_FRAMES = 8  # frames per camera in `show`, evenly spaced over the episode


def run(args: Sequence[str]) -> str:
    """The command's stdout for `args` (after `trainer dataset`)."""
    if not args or args[0] not in ("info", "show"):
        raise ConfigError(
            f"trainer dataset needs info or show: {USAGE.splitlines()[0].removeprefix('usage: ')}"
        )
    flags = _flags(args[1:])
    if _is_mixture(flags):
        return _mixture_info(args[0], flags)
    root = LeRobotConfig(
        repo_id=flags.pop("dataset.repo_id", None),
        root=flags.pop("dataset.root", None),
        **_streaming(flags),
    ).local_root()
    if args[0] == "info":
        as_json = "json" in flags
        flags.pop("json", None)
        _no_more(flags)
        summary = describe(root)
        return json.dumps(summary, indent=2) if as_json else _lines(summary)
    if "episode" not in flags:
        raise ConfigError("trainer dataset show needs --episode=N (an episode index of the dataset)")
    episode = _int(flags.pop("episode"), "--episode")
    output = Path(flags.pop("output", None) or f"episode_{episode}.png")
    _no_more(flags)
    show(root, episode, output)
    return str(output)


def _streaming(flags: dict[str, str | None]) -> dict[str, Any]:
    """--dataset.streaming and --dataset.cache_size, as a dataset config takes them."""
    return {
        "streaming": (flags.pop("dataset.streaming", None) or "false").lower() in ("true", "1", "yes", ""),
        "cache_size": flags.pop("dataset.cache_size", None) or "1GiB",
    }


def _is_mixture(flags: dict[str, str | None]) -> bool:
    listed = any((flags.get(f"dataset.{name}") or "").startswith("[") for name in ("repo_id", "root"))
    return listed or "dataset.mixture" in flags or "dataset.weights" in flags


def _mixture_info(command: str, flags: dict[str, str | None]) -> str:
    """`info` of a mixture: each member's summary under its name, weight and episodes."""
    if command != "info":
        raise ConfigError(
            "trainer dataset show draws one dataset: pass one member's --dataset.root or --dataset.repo_id"
        )
    weights = flags.pop("dataset.weights", None)
    config = MixtureConfig(
        mixture=flags.pop("dataset.mixture", None),
        repo_id=flags.pop("dataset.repo_id", None),
        root=flags.pop("dataset.root", None),
        revision=flags.pop("dataset.revision", None),
        weights=None if weights is None else _weights(weights),
        **_streaming(flags),
    )
    as_json = "json" in flags
    flags.pop("json", None)
    _no_more(flags)
    total = sum(member.weight for member in config.members)
    members = []
    for index, (member, label) in enumerate(zip(config.members, config.labels(), strict=True)):
        with config.naming(index):
            summary = describe(config.member_config(index).local_root())
        members.append(
            {"member": label, "weight": member.weight / total, "episodes_used": member.episodes, **summary}
        )
    if as_json:
        return json.dumps({"mixture": members}, indent=2)
    lines = [f"mixture of {len(members)} LeRobotDatasets:"]
    for entry in members:
        used = "all episodes" if entry["episodes_used"] is None else f"episodes {entry['episodes_used']}"
        lines.append(f"member {entry['member']}: weight {entry['weight']:.3g}, {used}")
        lines.extend("  " + line for line in _lines(entry).splitlines())
    return "\n".join(lines)


def _weights(value: str) -> list[float]:
    try:
        weights = json.loads(value)
        return [float(w) for w in weights]
    except (ValueError, TypeError):
        raise ConfigError(f"--dataset.weights={value} is not a list of numbers: write '[3,1]'") from None


def describe(root: DatasetPath) -> dict[str, Any]:
    """What `info` reports, as plain values."""
    info = fmt.read_info(root)
    ranges = fmt.read_episode_ranges(root)
    cameras = {}
    for name in info.cameras:
        feature = info.features[name]
        channels, height, width = info.camera_shape(name)
        video = feature.get("info") or {}
        encoding = (
            f"{video.get('video.codec', '?')} {video.get('video.pix_fmt', '')}".strip()
            if feature["dtype"] == "video"
            else "image (PNG/JPEG in parquet)"
        )
        cameras[name] = {"dtype": feature["dtype"], "height": height, "width": width, "channels": channels}
        cameras[name]["encoding"] = encoding
    return {
        "root": str(root),
        "codebase_version": fmt.CODEBASE_VERSION,
        "fps": info.fps,
        "episodes": len(ranges),
        "frames": sum(end - start for start, end in ranges.values()),
        "features": {n: {"dtype": f.get("dtype"), "shape": f.get("shape")} for n, f in info.features.items()},
        "cameras": cameras,
        "bytes": {part: total_size(root / part) for part in ("data", "videos", "meta")},
    }


def show(root: DatasetPath, episode: int, output: Path) -> None:
    """The PNG of `episode`: a frame strip per camera above the state and action curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    frames = LeRobotFrames(root, [episode])
    cameras = frames.cameras.names
    picks = np.unique(np.linspace(0, len(frames) - 1, STRIP_FRAMES).round().astype(int))
    figure = plt.figure(figsize=(1.6 * len(picks), 1.4 * len(cameras) + 4.5), layout="constrained")
    grid = figure.add_gridspec(len(cameras) + 2, len(picks), height_ratios=[1.2] * len(cameras) + [2, 2])
    for row, name in enumerate(cameras):
        for col, position in enumerate(picks):
            axis = figure.add_subplot(grid[row, col])
            axis.imshow(frames.cameras.frame(name, int(position)).permute(1, 2, 0).numpy())
            axis.set_xticks([])
            axis.set_yticks([])
            if col == 0:
                axis.set_ylabel(name.removeprefix("observation.images."), fontsize=8)
            if row == 0:
                axis.set_title(f"frame {int(position)}", fontsize=8)
    for row, name in enumerate(("observation.state", "action"), start=len(cameras)):
        axis = figure.add_subplot(grid[row, :])
        if name in frames.columns:
            values = frames.columns[name]
            for k in range(values.shape[1]):
                axis.plot(values[:, k], label=f"{name}[{k}]")
            axis.legend(fontsize=7, loc="upper right", ncols=min(values.shape[1], 4))
        axis.set_ylabel(name, fontsize=8)
    axis.set_xlabel("frame index in the episode", fontsize=8)
    figure.suptitle(f"{root.name}: episode {episode} ({len(frames)} frames)", fontsize=10)
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, dpi=100)
    plt.close(figure)


def _lines(summary: dict[str, Any]) -> str:
    sizes = ", ".join(f"{part}/ {_mib(n)}" for part, n in summary["bytes"].items())
    lines = [
        f"LeRobotDataset {summary['codebase_version']} at {summary['root']}: {summary['episodes']} episodes, "
        f"{summary['frames']} frames, {summary['fps']:g} fps; {sizes}",
        "features:",
        *(f"  {name}: {f['dtype']} {f['shape']}" for name, f in summary["features"].items()),
        "cameras:" if summary["cameras"] else "cameras: none",
        *(
            f"  {name}: {c['width']}x{c['height']}x{c['channels']} {c['dtype']}, {c['encoding']}"
            for name, c in summary["cameras"].items()
        ),
    ]
    return "\n".join(lines)


def _flags(args: Sequence[str]) -> dict[str, str | None]:
    flags: dict[str, str | None] = {}
    for arg in args:
        if not arg.startswith("--"):
            raise ConfigError(f"trainer dataset: unexpected argument {arg!r}; {USAGE.splitlines()[0]}")
        name, sep, value = arg[2:].partition("=")
        flags[name] = value if sep else None
    return flags


def _no_more(flags: dict[str, str | None]) -> None:
    if flags:
        raise ConfigError(f"trainer dataset: unknown flag --{next(iter(flags))}; {USAGE.splitlines()[0]}")


def _int(value: str | None, flag: str) -> int:
    try:
        return int(value or "")
    except ValueError:
        raise ConfigError(f"{flag} must be an episode index (an integer), got {value!r}") from None


def _mib(size: int) -> str:
    return f"{size / 2**20:.2f} MiB"
