"""Mixture sampling overhead: what drawing a batch from a weighted mixture costs beyond drawing it from
one dataset of the same frames, against the time of a training step.

In this process, on in-memory datasets (where gathering costs least, so the mixture's share is at its
largest; a camera dataset's decoding only adds to both sides):

- single: `GlobalOrderSampler.next_indices` + `gather` of a batch from one dataset of --frames frames;
- mixture: the same from a `Mixture` of --members datasets splitting those frames, drawn by unequal
  weights (`WeightedOrder`: the epoch's order, then each batch routed to its members and put back in
  order); the epoch's order is drawn once per epoch, its cost spread over the epoch's batches;
- step: one training step of LeRobot's ACT at its default sizes and batch (8) on the single dataset (gather,
  normalize, forward/backward, AdamW), the denominator of the goal (overhead < 1 % of a step).

The datasets take turns batch by batch, so the load of a shared machine falls on both alike; medians.
Run through `nox -s bench` (never part of the tests).

Usage: python benchmarks/bench_mixture.py [--frames 400000] [--members 8] [--batch 8] [--batches 400]
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np
import torch

from trainer.data.dataset import ArrayDataset
from trainer.data.pipeline.mixture import Mixture
from trainer.data.pipeline.processors import build_processors
from trainer.data.pipeline.sampler import GlobalOrderSampler
from trainer.policies import build_policy
from trainer.policies.act import ACTConfig

OBS_DIM, ACTION_DIM, EPISODE = 14, 14, 400  # a bimanual arm's joints


def datasets(frames: int, members: int) -> tuple[ArrayDataset, Mixture]:
    """One dataset of `frames` frames, and the same frames as a mixture of `members` datasets."""
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((frames, OBS_DIM), dtype=np.float32)
    act = rng.standard_normal((frames, ACTION_DIM), dtype=np.float32)
    single = ArrayDataset(obs, act, [EPISODE] * (frames // EPISODE))
    bounds = np.linspace(0, frames // EPISODE, members + 1).astype(int) * EPISODE
    parts = [
        ArrayDataset(obs[a:b], act[a:b], [EPISODE] * ((b - a) // EPISODE))
        for a, b in itertools.pairwise(bounds)
    ]
    weights = [float(k + 1) for k in range(members)]  # unequal: some over-, some undersampled
    return single, Mixture(parts, weights, [f"member{k}" for k in range(members)])


def time_draws(
    single: ArrayDataset, mixture: Mixture, batch: int, batches: int, chunk: int
) -> tuple[float, float]:
    """Median seconds of drawing and gathering one batch, single and mixture, taking turns."""
    samplers = [
        GlobalOrderSampler(len(single), batch, 1, 0, seed=0),
        GlobalOrderSampler(len(mixture), batch, 1, 0, seed=0, weighted=mixture.weighted_order),
    ]
    times: list[list[float]] = [[], []]
    for _ in range(batches):
        for k, (dataset, sampler) in enumerate(zip((single, mixture), samplers, strict=True)):
            start = time.perf_counter()
            dataset.gather(sampler.next_indices(), chunk)
            times[k].append(time.perf_counter() - start)
    return float(np.median(times[0])), float(np.median(times[1]))


def time_epoch_order(mixture: Mixture) -> float:
    """Seconds to draw one epoch's order of the mixture (once per epoch)."""
    start = time.perf_counter()
    mixture.weighted_order.order(0, 1)
    return time.perf_counter() - start


def time_step(single: ArrayDataset, batch: int, steps: int) -> float:
    """Median seconds of one ACT training step (default sizes, state only) on batches of `batch`."""
    torch.manual_seed(0)
    config = ACTConfig(dropout=0.0)
    policy = build_policy(config, single.obs_dim, single.action_dim)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-4)
    pre, _ = build_processors(single.stats())
    sampler = GlobalOrderSampler(len(single), batch, 1, 0, seed=0)
    times = []
    for step in range(steps + 2):
        start = time.perf_counter()
        loss, _ = policy(pre(single.gather(sampler.next_indices(), config.chunk_size)))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step >= 2:  # after warm-up
            times.append(time.perf_counter() - start)
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=400_000)
    parser.add_argument("--members", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    single, mixture = datasets(args.frames, args.members)
    chunk = ACTConfig().chunk_size
    one, mixed = time_draws(single, mixture, args.batch, args.batches, chunk)
    order = time_epoch_order(mixture)
    per_batch_order = order / (len(mixture) // args.batch)
    step = time_step(single, args.batch, args.steps)
    overhead = mixed - one + per_batch_order
    print(
        f"mixture sampling: {args.members} members, {args.frames} frames, batch {args.batch}, chunk {chunk}"
    )
    print(f"  draw + gather, single dataset    {one * 1e3:8.3f} ms")
    print(f"  draw + gather, mixture           {mixed * 1e3:8.3f} ms  ({mixed / one:.2f}x)")
    print(
        f"  epoch order, once per epoch      {order * 1e3:8.1f} ms  ({per_batch_order * 1e3:.4f} ms per batch)"
    )
    print(f"  ACT step (default sizes)         {step * 1e3:8.1f} ms")
    print(
        f"  mixture overhead per batch       {overhead * 1e3:8.3f} ms = {overhead / step:.4%} of a step (goal < 1 %)"
    )
    print(f"  (below 1 % of any step longer than {overhead * 100 * 1e3:.1f} ms)")


if __name__ == "__main__":
    main()
