"""LeRobotDataset input benchmark: load time of a large dataset, and step time against dataset size.

Writes LeRobotDatasets v3.0 of 10,000 and --frames (default 1,000,000) frames x 32 float features
(one 30-value `observation.state`, a 2-value `action`, plus an image column that is never read) in
data files of 100,000 rows, then measures, in this process:

- load: `LeRobotConfig(root).load()` (metadata, episode ranges, columns, statistics), against the
  floor of reading the same two feature columns with `pyarrow.parquet.read_table` alone;
- step: the median time of one training step (gather a batch, normalize, ACT forward/backward, AdamW)
  on the small and on the large dataset, taking turns; the ratio should stay near 1 (no per-step
  cost grows with the size).

Prints a table with ratios. Run through `nox -s bench` (never part of the tests).

Usage: python benchmarks/bench_lerobot.py [--frames 1000000] [--steps 50] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

OBS, ACTION, IMAGE = "observation.state", "action", "observation.images.top"
OBS_DIM, ACTION_DIM = 30, 2
ROWS_PER_FILE = 100_000
EPISODE = 500


def write_dataset(root: Path, frames: int) -> None:
    """A LeRobotDataset v3.0 of `frames` frames in episodes of 500, learnable enough to train."""
    rng = np.random.default_rng(0)
    episodes = -(-frames // EPISODE)
    for n, start in enumerate(range(0, frames, ROWS_PER_FILE)):
        rows = min(ROWS_PER_FILE, frames - start)
        obs = rng.standard_normal((rows, OBS_DIM), dtype=np.float32)
        act = obs[:, :ACTION_DIM] * 0.5
        index = np.arange(start, start + rows)
        table = pa.table(
            {
                OBS: pa.FixedSizeListArray.from_arrays(pa.array(obs.reshape(-1)), OBS_DIM),
                ACTION: pa.FixedSizeListArray.from_arrays(pa.array(act.reshape(-1)), ACTION_DIM),
                IMAGE: pa.array([b"never-decoded"] * rows, pa.binary()),
                "episode_index": pa.array(index // EPISODE),
                "index": pa.array(index),
            }
        )
        path = root / f"data/chunk-{n // 1000:03d}/file-{n % 1000:03d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path)
    starts = np.arange(episodes) * EPISODE
    meta = pa.table(
        {
            "episode_index": pa.array(np.arange(episodes)),
            "dataset_from_index": pa.array(starts),
            "dataset_to_index": pa.array(np.minimum(starts + EPISODE, frames)),
        }
    )
    (root / "meta/episodes/chunk-000").mkdir(parents=True)
    pq.write_table(meta, root / "meta/episodes/chunk-000/file-000.parquet")
    features = {
        OBS: {"dtype": "float32", "shape": [OBS_DIM]},
        ACTION: {"dtype": "float32", "shape": [ACTION_DIM]},
        IMAGE: {"dtype": "image", "shape": [64, 64, 3]},
        "episode_index": {"dtype": "int64", "shape": [1]},
        "index": {"dtype": "int64", "shape": [1]},
    }
    info = {"codebase_version": "v3.0", "fps": 30, "features": features, "total_frames": frames}
    (root / "meta/info.json").write_text(json.dumps(info))
    stats = {
        OBS: {"mean": [0.0] * OBS_DIM, "std": [1.0] * OBS_DIM},
        ACTION: {"mean": [0.0] * 2, "std": [0.5] * 2},
    }
    (root / "meta/stats.json").write_text(json.dumps(stats))


def time_load(root: Path) -> tuple[float, float, object]:
    """(trainer load seconds, pyarrow floor seconds, the dataset)."""
    from trainer.data.sources.lerobot import LeRobotConfig

    start = time.perf_counter()
    for path in sorted(root.glob("data/chunk-*/file-*.parquet")):
        pq.read_table(path, columns=[OBS, ACTION], memory_map=True)
    floor = time.perf_counter() - start
    start = time.perf_counter()
    dataset = LeRobotConfig(root=str(root)).load()
    return time.perf_counter() - start, floor, dataset


def time_steps(datasets: list[object], steps: int) -> list[float]:
    """Median seconds of one training step (gather a batch of 64, normalize, ACT with chunks of 5
    forward/backward, AdamW) per dataset. The datasets take turns step by step, so the load of a shared
    machine falls on all of them alike."""
    from trainer.data.pipeline.processors import build_processors
    from trainer.data.pipeline.sampler import GlobalOrderSampler
    from trainer.policies import build_policy
    from trainer.policies.act import ACTConfig

    runs = []
    for dataset in datasets:
        torch.manual_seed(0)
        config = ACTConfig(dropout=0.0)
        policy = build_policy(config, dataset.obs_dim, dataset.action_dim)  # type: ignore[attr-defined]
        optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
        pre, _ = build_processors(dataset.stats())  # type: ignore[attr-defined]
        sampler = GlobalOrderSampler(len(dataset), 64, 1, 0, seed=0)  # type: ignore[arg-type]
        runs.append((dataset, config, policy, optimizer, pre, sampler, []))
    for step in range(steps + 5):
        for dataset, config, policy, optimizer, pre, sampler, times in runs:
            start = time.perf_counter()
            batch = pre(dataset.gather(sampler.next_indices(), config.chunk_size))  # type: ignore[attr-defined]
            loss, _ = policy(batch)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if step >= 5:  # after warm-up
                times.append(time.perf_counter() - start)
    return [float(np.median(run[-1])) for run in runs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=1_000_000)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--workdir", type=Path, default=None, help="kept between runs when given")
    args = parser.parse_args()
    torch.set_num_threads(1)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-lerobot-"))
    try:
        loads = []
        for frames in (10_000, args.frames):
            root = work / f"frames_{frames}"
            if not (root / "meta/info.json").exists():
                shutil.rmtree(root, ignore_errors=True)
                write_dataset(root, frames)
            loads.append((frames, *time_load(root)))
        step_times = time_steps([dataset for *_, dataset in loads], args.steps)
        print(f"{'frames':>10} {'load s':>8} {'pyarrow s':>10} {'load/pyarrow':>13} {'step ms':>8}")
        for (frames, load, floor, _), step in zip(loads, step_times, strict=True):
            print(f"{frames:>10} {load:>8.2f} {floor:>10.2f} {load / floor:>13.2f} {step * 1000:>8.2f}")
        print(f"step time ratio ({args.frames} / 10000 frames): {step_times[1] / step_times[0]:.2f}")
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
