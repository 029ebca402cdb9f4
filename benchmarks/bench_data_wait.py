"""How much of a training step waits for camera data: a 2-rank FSDP2 run of LeRobot's ACT (the size of
bench_act.py) on a LeRobotDataset with two 96x96 AV1 video cameras, frames decoded in --num_workers=2
DataLoader workers per rank. Each rank times how long the loop is blocked asking for its next batch
(data_wait_worker.py; the first batch, which waits for the workers to start, is left out) against the
loop's time over the same steps; the share is that ratio (goal: under 10 %). Run through `nox -s bench`.

Usage: python benchmarks/bench_data_wait.py [--steps 24] [--batch 4] [--workers 2] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from act_cameras import ACT_FLAGS, CAMERAS, SIZE
from bench_act import torchrun
from bench_video import pick_codec, write_dataset

HERE = Path(__file__).parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-data-wait-"))
    root, out = workdir / "dataset", workdir / "run"
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    codec = pick_codec()
    write_dataset(root, episodes=8, length=100, height=SIZE, width=SIZE, codec=codec, cameras=tuple(CAMERAS))
    policy = [f"--policy.{k}={'null' if v is None else v}" for k, v in ACT_FLAGS.items()]
    output = torchrun(
        HERE / "data_wait_worker.py", f"--dataset.root={root}", "--policy.type=act", *policy,
        "--parallelism.dp_shard=2", f"--num_workers={args.workers}", f"--batch_size={args.batch}",
        f"--steps={args.steps}", f"--log_freq={args.steps}", f"--save_freq={10 * args.steps}",
        f"--output_dir={out}",
    )  # fmt: skip
    ranks = [
        json.loads(line.removeprefix("RESULT ")) for line in output.splitlines() if line.startswith("RESULT ")
    ]
    print(f"data wait, 2-rank FSDP2 ACT, two {SIZE}x{SIZE} {codec} cameras, --num_workers={args.workers}:")
    for rank in sorted(ranks, key=lambda r: r["rank"]):
        share = rank["wait_s"] / rank["loop_s"]
        print(
            f"  rank {rank['rank']}: waited {rank['wait_s']:.2f} s of {rank['loop_s']:.2f} s over "
            f"{rank['steps'] - 1} steps = {100 * share:.1f} % (first batch {rank['first_s']:.2f} s, not counted)"
        )
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
