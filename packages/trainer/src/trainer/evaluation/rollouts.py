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

from trainer.config.dataset import Dataset
from trainer.config.sections import EvaluationSection
from trainer.data.dataset import ACTION_KEY, OBS_KEY, PAD_KEY, TASK_KEY
from trainer.data.embedded import sim
from trainer.evaluation.inference import LoadedPolicy
from trainer.evaluation.validation import rank_batches

EVAL_SEED_BASE = 10_000
Reduce = Callable[[torch.Tensor], torch.Tensor]  # sum over ranks


@torch.no_grad()
def rollout_returns(
    act: Callable[[dict[str, np.ndarray | str]], np.ndarray],
    episodes: int,
    world: int,
    rank: int,
    reduce: Reduce,
    camera: bool = False,
    reset: Callable[[], None] = lambda: None,
) -> dict[str, float]:
    """Mean return of `act` and of random torques over `episodes` start states split across ranks, on
    the camera task with `camera`. `act` gets the raw observation a robot would give (the state
    vector, and the camera frame as uint8 H x W x 3); `reset` runs before each of its episodes."""
    per_rank = -(-episodes // world)
    totals = torch.zeros(3, dtype=torch.float64)
    for i in range(per_rank):
        seed = EVAL_SEED_BASE + rank * per_rank + i
        reset()
        totals[0] += sim.rollout(lambda obs: act(raw_observation(obs)), seed, camera=camera).total_return
        totals[1] += sim.rollout(sim.random_controller(seed), seed, camera=camera).total_return
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
    act: Callable[[dict[str, torch.Tensor]], torch.Tensor],
    dataset: Dataset,
    world: int,
    rank: int,
    reduce: Reduce,
    batch_size: int = 256,
    reset: Callable[[], None] = lambda: None,
) -> dict[str, float]:
    """`action_mse` of `act` (a raw batch -> actions) on every frame of `dataset`, and
    `baseline_mse` of predicting the dataset's mean action. `reset` runs before each batch: the frames
    of a batch are not one episode's steps, so each is scored by the first action predicted for it
    (not by an action left in ACT's queue by the previous batch)."""
    mean = dataset.stats()[ACTION_KEY]["mean"].double()
    totals = torch.zeros(3, dtype=torch.float64)
    for indices, weight in rank_batches(len(dataset), world, rank, batch_size):
        batch = dataset.gather(indices, 1)
        reset()
        target = batch[ACTION_KEY][:, 0].double()
        observation = {k: v for k, v in batch.items() if k not in (ACTION_KEY, PAD_KEY)}
        predicted = act(observation).double().cpu()
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


def raw_observation(obs: sim.Observation) -> dict[str, np.ndarray | str]:
    """A sim step's observation as a robot gives it: the state vector, the camera frame if any, and
    the task's language instruction (the target, the expert's privileged information, is left out; a
    policy that reads no `task` ignores it)."""
    raw: dict[str, np.ndarray | str] = {OBS_KEY: obs.state, TASK_KEY: sim.instruction(obs.frame is not None)}
    if obs.frame is not None:
        raw[sim.CAMERA] = obs.frame
    return raw


def summary_line(result: dict[str, Any]) -> str:
    """The human-readable result of `trainer eval`; the EMA weights are named when they were scored."""
    weights = " (EMA weights)" if result.get("weights") == "ema" else ""
    if "action_mse" in result:
        return (
            f"action_mse {result['action_mse']:.5g} vs baseline_mse {result['baseline_mse']:.5g} (predicting the "
            f"dataset's mean action) over {result['frames']} frames of {result['episodes']} episodes{weights}"
        )
    return (
        f"policy return {result['policy_return']:.1f} vs random_return {result['random_return']:.1f} "
        f"over {result['episodes']} episodes{weights}"
    )


@torch.no_grad()
def score_at_end(
    accelerator: Any,
    model: torch.nn.Module,
    preprocessor: Any,
    postprocessor: Any,
    section: EvaluationSection,
) -> tuple[float, float]:
    """Collective: call on all ranks. The end-of-run score on the data's sim task: mean return of the
    policy and of random torques on the same start states (`rollout_returns`: split across ranks, every
    rank running as many, since a sharded policy's select_action gathers parameters with the others)."""
    policy = accelerator.unwrap_model(model)
    policy.eval()
    acting = LoadedPolicy(policy, preprocessor, postprocessor, accelerator.device)

    def act(observation: dict[str, np.ndarray | str]) -> np.ndarray:
        return acting.select_action(observation).cpu().numpy()

    def reduce(totals: torch.Tensor) -> torch.Tensor:
        return accelerator.reduce(totals.to(accelerator.device), reduction="sum").cpu()

    world, rank = accelerator.num_processes, accelerator.process_index
    result = rollout_returns(
        act, section.rollout_episodes, world, rank, reduce, section.rollout_camera, policy.reset
    )
    policy.train()
    return result["policy_return"], result["random_return"]
