"""Scoring a policy without training it: sim rollouts, or the offline action error on a dataset.

On the sim task the policy's mean return is compared with uniform random torques on the same start
states. On a dataset without a simulator (a LeRobotDataset), the policy's first predicted action at
every frame is compared with the recorded action (mean squared error, in the dataset's units), next
to the error of always predicting the dataset's mean action. Both split their work across ranks and
sum it with `reduce` (every rank runs as many steps: a sharded policy acts together).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from trainer.data import sim
from trainer.data.dataset import ACTION_KEY, Dataset
from trainer.evaluation.validation import rank_batches

EVAL_SEED_BASE = 10_000
Reduce = Callable[[torch.Tensor], torch.Tensor]  # sum over ranks


@torch.no_grad()
def rollout_returns(
    act: Callable[[np.ndarray], np.ndarray], episodes: int, world: int, rank: int, reduce: Reduce
) -> dict[str, float]:
    """Mean return of `act` and of random torques over `episodes` start states split across ranks."""
    per_rank = -(-episodes // world)
    totals = torch.zeros(3, dtype=torch.float64)
    for i in range(per_rank):
        seed = EVAL_SEED_BASE + rank * per_rank + i
        totals[0] += sim.rollout(act, seed)[2]
        totals[1] += sim.rollout(sim.random_controller(seed), seed)[2]
        totals[2] += 1
    totals = reduce(totals)
    count = max(float(totals[2]), 1.0)
    return {
        "policy_return": float(totals[0]) / count,
        "random_return": float(totals[1]) / count,
        "episodes": int(totals[2]),
    }


@torch.no_grad()
def action_errors(
    act: Callable[[torch.Tensor], torch.Tensor],
    dataset: Dataset,
    world: int,
    rank: int,
    reduce: Reduce,
    batch_size: int = 256,
) -> dict[str, float]:
    """`action_mse` of `act` (raw observation vectors -> actions) on every frame of `dataset`, and
    `baseline_mse` of predicting the dataset's mean action."""
    mean = dataset.stats()[ACTION_KEY]["mean"].double()
    totals = torch.zeros(3, dtype=torch.float64)
    for indices, weight in rank_batches(len(dataset), world, rank, batch_size):
        batch = dataset.gather(indices, 1)
        target = batch[ACTION_KEY][:, 0].double()
        predicted = act(batch["observation.state"]).double().cpu()
        totals[0] += weight * (predicted - target).square().mean(1).sum()
        totals[1] += weight * (mean - target).square().mean(1).sum()
        totals[2] += weight * len(indices)
    totals = reduce(totals)
    frames = max(float(totals[2]), 1.0)
    return {
        "action_mse": float(totals[0]) / frames,
        "baseline_mse": float(totals[1]) / frames,
        "episodes": len(dataset.episode_bounds()),
        "frames": int(totals[2]),
    }


def summary_line(result: dict[str, Any]) -> str:
    """The human-readable result of `trainer eval`."""
    if "action_mse" in result:
        return (
            f"action_mse {result['action_mse']:.5g} vs baseline_mse {result['baseline_mse']:.5g} (predicting the "
            f"dataset's mean action) over {result['frames']} frames of {result['episodes']} episodes"
        )
    return (
        f"policy return {result['policy_return']:.1f} vs random_return {result['random_return']:.1f} "
        f"over {result['episodes']} episodes"
    )
