"""Streaming benchmark: the camera dataset read through the DataLoader from moto's S3 server vs local disk.

Writes bench_video.py's LeRobotDataset (one video camera), uploads it to a bucket of moto's
S3-compatible server on loopback (the suite's helper, `tests/helpers/s3_server.py`), then measures in
one script, with the same --workers DataLoader workers and training order:

- local: `--dataset.root=DIR`;
- streamed: `--dataset.streaming=true --dataset.root=s3://bucket/dataset`, once per `--cache-sizes`
  entry (the default's small one is a 11th of the dataset: blocks are evicted and fetched again);

and prints samples/s of each, the ratio streamed / local, and each worker's peak resident memory
(VmHWM from /proc/<pid>/status) after the last epoch: the block cache bounds what a streamed worker
holds. Loopback has no network latency, so the ratio measures the client's cost (requests, copies),
not a cloud store's. Run through `nox -s bench` (never part of the tests).

Usage: python benchmarks/bench_stream.py [--episodes 8] [--frames 100] [--size 96x128] [--workers 2]
       [--epochs 2] [--batch 32] [--cache-sizes 64MiB,128KiB]
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import psutil
import torch
from bench_video import CAMERA, camera_dataset_parser, pick_codec, write_dataset

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # the suite's server helper, shared rather than copied

from helpers.s3_server import start_s3_server  # noqa: E402


def worker_peaks(server_pid: int) -> list[float]:
    """Each DataLoader worker's peak resident memory (VmHWM), MiB (the S3 server, a child too, left out)."""
    peaks = []
    for child in psutil.Process().children():
        if child.pid == server_pid:
            continue
        status = Path(f"/proc/{child.pid}/status").read_text()
        line = next(entry for entry in status.splitlines() if entry.startswith("VmHWM:"))
        peaks.append(int(line.split()[1]) / 1024)
    return peaks


def rate(
    flags: dict[str, object], workers: int, batch: int, epochs: int, server_pid: int
) -> tuple[float, list[float]]:
    """Samples per second of the camera pipeline in training order, and the workers' VmHWM (MiB)."""
    from trainer.data.pipeline import loader
    from trainer.data.pipeline.sampler import GlobalOrderSampler
    from trainer.data.sources.lerobot import LeRobotConfig

    dataset = LeRobotConfig(**flags).load([CAMERA])  # type: ignore[arg-type]
    sampler = GlobalOrderSampler(len(dataset), batch, 1, 0, seed=0)
    steps = (len(dataset) // batch) * epochs
    settings = loader.LoaderSettings(num_workers=workers, prefetch_factor=2, timeout_s=300)
    feed = loader.batches(dataset, sampler, range(steps), 1, settings)
    next(feed)  # workers started, first batch decoded: not part of the rate
    start, samples = time.perf_counter(), 0
    for _ in range(1, steps):
        samples += len(next(feed)[CAMERA])
    elapsed = time.perf_counter() - start
    peaks = worker_peaks(server_pid)
    feed.close()
    return samples / elapsed, peaks


def main() -> None:
    parser = camera_dataset_parser(__doc__.splitlines()[0], epochs=2)
    parser.add_argument("--cache-sizes", default="64MiB,128KiB", help="one streamed run per size")
    args = parser.parse_args()
    torch.set_num_threads(1)
    height, width = (int(v) for v in args.size.split("x"))
    workdir = Path(tempfile.mkdtemp(prefix="bench_stream_"))
    server = start_s3_server()
    os.environ.update(server.env)
    try:
        import fsspec

        root = workdir / "dataset"
        write_dataset(root, args.episodes, args.frames, height, width, pick_codec())
        store = fsspec.filesystem("s3", use_listings_cache=False)
        store.mkdir("bench")
        store.put(f"{root}/", "s3://bench/dataset", recursive=True)
        size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
        print(f"dataset: {args.episodes * args.frames} frames of {height}x{width}, {size / 2**20:.2f} MiB")
        shape = (args.workers, args.batch, args.epochs, server.process.pid)
        local, local_peaks = rate({"root": str(root)}, *shape)
        print(f"| read ({args.workers} workers) | samples/s | vs local | worker VmHWM (MiB) |")
        print("|---|---|---|---|")
        print(f"| local disk | {local:.0f} | 1.00 | {', '.join(f'{p:.0f}' for p in local_peaks)} |")
        for cache in args.cache_sizes.split(","):
            flags = {"root": "s3://bench/dataset", "streaming": True, "cache_size": cache}
            streamed, peaks = rate(flags, *shape)
            print(
                f"| streamed from moto (cache {cache}) | {streamed:.0f} | {streamed / local:.2f} | "
                f"{', '.join(f'{p:.0f}' for p in peaks)} |"
            )
        from trainer.data.format import remote

        print(f"stream_retries: {remote.retry_count()}")
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
