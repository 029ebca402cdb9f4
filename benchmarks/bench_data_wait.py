"""How much of a training step waits for camera data: a 2-rank FSDP2 run of LeRobot's ACT (the size of
bench_act.py) on a LeRobotDataset with two 96x96 AV1 video cameras, frames decoded in --num_workers=2
DataLoader workers per rank. With `--policy diffusion` the run is LeRobot's Diffusion Policy with its 2
observation steps (each sample decodes both cameras' current and previous frames), a separate ResNet-18
per camera on 84x84 crops and a U-Net of [64, 128, 256] over a horizon of 16 (LeRobot's widths,
[512, 1024, 2048], make a CPU step minutes long, and a longer step only hides the wait). Each rank times how long the loop is blocked asking for its next batch
(data_wait_worker.py; the first batch, which waits for the workers to start, is left out) against the
loop's time over the same steps; the share is that ratio (goal: under 10 %). The same run then streams
the dataset (`--dataset.streaming=true`) from moto's S3 server on loopback (tests/helpers/s3_server.py),
with a cache of `--cache-size` per process, and its steps/s is compared with the local run's (issue
35's goal: >= 0.8x, data wait under 10 %). Run through `nox -s bench`.

Usage: python benchmarks/bench_data_wait.py [--policy act|diffusion] [--steps 24] [--batch 4] [--workers 2]
       [--cache-size 64MiB] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import fsspec
from act_cameras import ACT_FLAGS, CAMERAS, SIZE
from bench_act import torchrun
from bench_video import pick_codec, write_dataset

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "tests"))  # the suite's S3 server helper, shared rather than copied

from helpers.s3_server import start_s3_server  # noqa: E402

POLICIES = {
    "act": ["--policy.type=act", *(f"--policy.{k}={'null' if v is None else v}" for k, v in ACT_FLAGS.items())],
    "diffusion": [
        "--policy.type=diffusion", "--policy.n_obs_steps=2", "--policy.horizon=16", "--policy.n_action_steps=8",
        "--policy.down_dims=[64,128,256]", "--policy.crop_shape=[84,84]", "--policy.pretrained_backbone_weights=null",
    ],
}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", choices=tuple(POLICIES), default="act")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cache-size", default="64MiB")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-data-wait-"))
    root = workdir / "dataset"
    shutil.rmtree(root, ignore_errors=True)
    codec = pick_codec()
    write_dataset(root, episodes=8, length=100, height=SIZE, width=SIZE, codec=codec, cameras=tuple(CAMERAS))
    name = "ACT" if args.policy == "act" else "Diffusion Policy, 2 observation steps"
    print(f"data wait, 2-rank FSDP2 {name}, two {SIZE}x{SIZE} {codec} cameras, --num_workers={args.workers}:")
    local = measure(args, "local disk", [f"--dataset.root={root}"], workdir / "run")
    server = start_s3_server()
    try:
        os.environ.update(server.env)  # the trainer's ranks inherit the endpoint and credentials
        store = fsspec.filesystem("s3", use_listings_cache=False)
        store.mkdir("bench")
        store.put(f"{root}/", "s3://bench/dataset", recursive=True)
        streaming = ["--dataset.root=s3://bench/dataset", "--dataset.streaming=true"]
        label, cache = f"streamed, cache {args.cache_size}", f"--dataset.cache_size={args.cache_size}"
        streamed = measure(args, label, [*streaming, cache], workdir / "streamed")
    finally:
        server.stop()
    print(f"streamed steps/s vs local: {streamed / local:.2f}x")
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)


def measure(args: argparse.Namespace, label: str, data: list[str], out: Path) -> float:
    """One 2-rank run reading `data`: prints each rank's data-wait share, returns the slower rank's
    steps per second (first batch left out)."""
    shutil.rmtree(out, ignore_errors=True)
    output = torchrun(
        HERE / "data_wait_worker.py", *data, *POLICIES[args.policy],
        "--parallelism.dp_shard=2", f"--num_workers={args.workers}", f"--batch_size={args.batch}",
        f"--steps={args.steps}", f"--log_freq={args.steps}", f"--save_freq={10 * args.steps}",
        f"--output_dir={out}",
    )  # fmt: skip
    ranks = [
        json.loads(line.removeprefix("RESULT ")) for line in output.splitlines() if line.startswith("RESULT ")
    ]
    print(f"{label}:")
    for rank in sorted(ranks, key=lambda r: r["rank"]):
        share = rank["wait_s"] / rank["loop_s"]
        print(
            f"  rank {rank['rank']}: waited {rank['wait_s']:.2f} s of {rank['loop_s']:.2f} s over "
            f"{rank['steps'] - 1} steps = {100 * share:.1f} % (first batch {rank['first_s']:.2f} s, not counted)"
        )
    return min((rank["steps"] - 1) / rank["loop_s"] for rank in ranks)


if __name__ == "__main__":
    main()
