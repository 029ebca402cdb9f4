"""Camera input benchmark: the training pipeline's decoding rate against PyAV decoding front to back.

Writes a LeRobotDataset v3.0 with one video camera as LeRobot writes it (AV1 with libsvtav1 when PyAV's
FFmpeg has it, else libaom-av1, else H.264; yuv420p, keyframe interval 2, every episode back to back in
one file), then measures in this machine's processes:

- sequential: PyAV decoding every frame of the file front to back (`to_ndarray(format="rgb24")`), the
  floor any per-sample decoder is compared with;
- pipeline: the trainer's input pipeline (`trainer.data.pipeline.loader.batches`) in training order (the
  global-order sampler's random permutation), each sample seeking to its keyframe, with --workers
  DataLoader workers and with none;
- worker RSS: the resident memory of each worker after each epoch (it should stay flat: the open
  containers are bounded by the per-process LRU).

Prints frames/s and the ratios pipeline / sequential. Run through `nox -s bench` (never part of the
tests).

Usage: python benchmarks/bench_video.py [--episodes 8] [--frames 100] [--size 96x128] [--workers 2]
       [--epochs 3] [--batch 32] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import av
import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import torch

CAMERA, STATE, ACTION = "observation.images.front", "observation.state", "action"
FPS = 30
CODECS = ("libsvtav1", "libaom-av1", "libx264")


def pick_codec() -> str:
    available = av.codecs_available
    return next(name for name in CODECS if name in available)


def write_video(path: Path, frames: np.ndarray, codec: str) -> None:
    """`frames` (N, H, W, 3) uint8 as LeRobot's encoder writes them (yuv420p, g=2)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    options = {"g": "2", "crf": "30"}
    if codec == "libsvtav1":
        options["preset"] = "12"
    elif codec == "libaom-av1":
        options["cpu-used"] = "8"
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=FPS, options=options)
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        for image in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
        container.mux(stream.encode())


def write_dataset(
    root: Path,
    episodes: int,
    length: int,
    height: int,
    width: int,
    codec: str,
    cameras: tuple[str, ...] = (CAMERA,),
) -> None:
    """A LeRobotDataset v3.0 whose `cameras` are videos (each camera's frames shifted, so they differ)."""
    total = episodes * length
    rng = np.random.default_rng(0)
    t = np.arange(total)[:, None, None]
    y, x = np.mgrid[0:height, 0:width]
    base = (128 + 100 * np.sin((x[None] + 2 * t) / 9.0) * np.cos((y[None] - t) / 7.0)).astype(np.int16)
    noise = rng.integers(-20, 20, size=(total, height, width), dtype=np.int16)
    gray = np.clip(base + noise, 0, 255).astype(np.uint8)
    frames = np.stack([gray, np.roll(gray, 3, axis=2), 255 - gray], axis=-1)
    for shift, camera in enumerate(cameras):
        write_video(
            root / f"videos/{camera}/chunk-000/file-000.mp4", np.roll(frames, 5 * shift, axis=2), codec
        )
    state = rng.standard_normal((total, 4)).astype(np.float32)
    episode = np.repeat(np.arange(episodes), length)
    frame_index = np.tile(np.arange(length), episodes)
    (root / "data/chunk-000").mkdir(parents=True)
    pq.write_table(
        pa.table(
            {
                STATE: pa.FixedSizeListArray.from_arrays(pa.array(state.reshape(-1)), 4),
                ACTION: pa.FixedSizeListArray.from_arrays(pa.array(state[:, :2].reshape(-1)), 2),
                "timestamp": pa.array((frame_index / FPS).astype(np.float32)),
                "frame_index": pa.array(frame_index),
                "episode_index": pa.array(episode),
                "index": pa.array(np.arange(total)),
                "task_index": pa.array(np.zeros(total, dtype=np.int64)),
            }
        ),
        root / "data/chunk-000/file-000.parquet",
    )
    starts = np.arange(episodes) * length
    seconds = length / FPS
    (root / "meta/episodes/chunk-000").mkdir(parents=True)
    pq.write_table(
        pa.table(
            {
                "episode_index": pa.array(np.arange(episodes)),
                "dataset_from_index": pa.array(starts),
                "dataset_to_index": pa.array(starts + length),
                **{
                    column: values
                    for camera in cameras
                    for column, values in (
                        (f"videos/{camera}/chunk_index", pa.array(np.zeros(episodes, dtype=np.int64))),
                        (f"videos/{camera}/file_index", pa.array(np.zeros(episodes, dtype=np.int64))),
                        (f"videos/{camera}/from_timestamp", pa.array(np.arange(episodes) * seconds)),
                        (f"videos/{camera}/to_timestamp", pa.array((np.arange(episodes) + 1) * seconds)),
                    )
                },
            }
        ),
        root / "meta/episodes/chunk-000/file-000.parquet",
    )
    scalar = {"dtype": "float32", "shape": [1], "names": None}
    integer = {"dtype": "int64", "shape": [1], "names": None}
    features = {
        STATE: {"dtype": "float32", "shape": [4], "names": None},
        **{
            camera: {"dtype": "video", "shape": [height, width, 3], "names": ["height", "width", "channels"]}
            for camera in cameras
        },
        ACTION: {"dtype": "float32", "shape": [2], "names": None},
        "timestamp": scalar,
        **{name: integer for name in ("frame_index", "episode_index", "index", "task_index")},
    }
    info = {"codebase_version": "v3.0", "fps": FPS, "features": features, "total_frames": total}
    (root / "meta/info.json").write_text(json.dumps(info))


def sequential_rate(path: Path) -> float:
    """Frames per second of PyAV decoding the whole file front to back to RGB arrays."""
    start, count = time.perf_counter(), 0
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        stream.thread_count = 1  # as the pipeline's decoders: the parallelism is the workers
        for frame in container.decode(stream):
            frame.to_ndarray(format="rgb24")
            count += 1
    return count / (time.perf_counter() - start)


def pipeline(root: Path, workers: int, batch: int, epochs: int) -> tuple[float, list[list[float]]]:
    """Frames per second of the training pipeline in training order, and each worker's RSS (MiB) after
    each epoch."""
    from trainer.data.pipeline import loader
    from trainer.data.pipeline.sampler import GlobalOrderSampler
    from trainer.data.sources.lerobot import LeRobotConfig

    dataset = LeRobotConfig(root=str(root)).load([CAMERA])
    sampler = GlobalOrderSampler(len(dataset), batch, 1, 0, seed=0)
    per_epoch = len(dataset) // batch
    settings = loader.LoaderSettings(num_workers=workers, prefetch_factor=2, timeout_s=300)
    feed = loader.batches(dataset, sampler, range(per_epoch * epochs), 1, settings)
    rss: list[list[float]] = []
    next(feed)  # workers started, first batch decoded: not part of the rate
    start, frames = time.perf_counter(), 0
    for step in range(1, per_epoch * epochs):
        frames += len(next(feed)[CAMERA])
        if (step + 1) % per_epoch == 0:
            children = psutil.Process().children()
            rss.append([child.memory_info().rss / 2**20 for child in children])
    return frames / (time.perf_counter() - start), rss


def camera_dataset_parser(description: str, epochs: int) -> argparse.ArgumentParser:
    """The options of a benchmark reading a written camera dataset through the DataLoader (this one's
    and bench_stream.py's)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--frames", type=int, default=100, help="frames per episode")
    parser.add_argument("--size", default="96x128", help="HxW of the camera")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=epochs)
    parser.add_argument("--batch", type=int, default=32)
    return parser


def main() -> None:
    parser = camera_dataset_parser(__doc__.splitlines()[0], epochs=3)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    height, width = (int(v) for v in args.size.split("x"))
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench_video_"))
    root = workdir / "dataset"
    shutil.rmtree(root, ignore_errors=True)
    codec = pick_codec()
    write_dataset(root, args.episodes, args.frames, height, width, codec)
    total = args.episodes * args.frames
    print(f"dataset: {total} frames of {height}x{width}, {codec} yuv420p g=2, one file ({workdir})")
    sequential = sequential_rate(root / f"videos/{CAMERA}/chunk-000/file-000.mp4")
    in_process, _ = pipeline(root, 0, args.batch, 1)
    with_workers, rss = pipeline(root, args.workers, args.batch, args.epochs)
    print("| decoding | frames/s | vs front to back |\n|---|---|---|")
    print(f"| PyAV front to back (1 thread) | {sequential:.0f} | 1.00 |")
    print(f"| pipeline, training order, 0 workers | {in_process:.0f} | {in_process / sequential:.2f} |")
    print(
        f"| pipeline, training order, {args.workers} workers | {with_workers:.0f} | "
        f"{with_workers / sequential:.2f} |"
    )
    for epoch, sizes in enumerate(rss, start=1):
        print(f"worker RSS after epoch {epoch}: " + ", ".join(f"{s:.0f} MiB" for s in sizes))
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
