"""Rolling a policy out in a vector environment: episodes in batches, each bounded in time, and what each
one scored (lerobot-eval's per-episode figures).

The environments of a batch start from consecutive seeds and run together until every one is done (or
the episode's step limit); what an environment returns after its own end is not counted. An episode
that takes longer than the time limit, an environment that raises, or a reward or observation that is
NaN ends the whole evaluation with one `EnvironmentFailure` line: the caller loses that score and
nothing else. The limit is a timer signal in this thread, so it also stops an environment stuck in
Python code (a worker process of an AsyncVectorEnv is stopped when the caller closes it).
"""

from __future__ import annotations

import contextlib
import math
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import numpy as np

from trainer.evaluation.environments import VectorEnv, raw_observations

Act = Callable[[dict[str, Any]], np.ndarray]  # a batch of raw observations -> (B, action_dim) actions


class EnvironmentFailure(Exception):
    """The environment crashed, hung past the time limit or returned NaN: one line, this score lost."""


@dataclass
class Episode:
    """One episode's figures, lerobot-eval's per-episode record, and its frames when it is rendered."""

    index: int
    seed: int
    sum_reward: float = 0.0
    max_reward: float = -math.inf
    success: bool = False
    steps: int = 0
    frames: list[np.ndarray] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        return {
            "episode_ix": self.index,
            "sum_reward": self.sum_reward,
            "max_reward": self.max_reward,
            "success": self.success,
            "seed": self.seed,
        }


@dataclass(frozen=True)
class Rollouts:
    """What `run_episodes` needs besides the policy: how many, from which seed, how long each may
    take, how many to render, and the feature names of the environment's keys."""

    n_episodes: int
    start_seed: int
    max_steps: int
    time_limit_s: float
    rendered: int
    names: dict[str, str]
    reads_task: bool


def run_episodes(env: VectorEnv, act: Act, reset: Callable[[], None], plan: Rollouts) -> list[Episode]:
    """`plan.n_episodes` episodes of `act` in `env`, in batches of `env.num_envs`; raises
    `EnvironmentFailure` (one line) when one fails."""
    episodes: list[Episode] = []
    while len(episodes) < plan.n_episodes:
        first = len(episodes)
        batch = [Episode(first + i, plan.start_seed + first + i) for i in range(env.num_envs)]
        render = max(0, min(plan.rendered - first, env.num_envs))
        with _failures(first), _time_limit(plan.time_limit_s, first):
            _run_batch(env, act, reset, batch, plan, render)
        episodes.extend(batch[: plan.n_episodes - first])
    return episodes


def _run_batch(
    env: VectorEnv,
    act: Act,
    reset: Callable[[], None],
    batch: list[Episode],
    plan: Rollouts,
    render: int,
) -> None:
    reset()
    observation, _ = env.reset(seed=[episode.seed for episode in batch])
    tasks = list(env.call("task_description")) if plan.reads_task else None
    done = np.zeros(len(batch), dtype=bool)
    _render(env, batch, render)
    for _ in range(plan.max_steps):
        action = np.asarray(act(raw_observations(observation, plan.names, tasks)), dtype=np.float32)
        observation, reward, terminated, truncated, info = env.step(action)
        _check_finite(observation, reward)
        success = np.asarray(info.get("is_success", np.zeros(len(batch))), dtype=bool)
        for i, episode in enumerate(batch):
            if done[i]:
                continue
            episode.sum_reward += float(reward[i])
            episode.max_reward = max(episode.max_reward, float(reward[i]))
            episode.success = episode.success or bool(success[i])
            episode.steps += 1
        if not done[:render].all():
            _render(env, batch, render)
        done |= np.asarray(terminated, dtype=bool) | np.asarray(truncated, dtype=bool)
        if done.all():
            break
    for episode in batch[:render]:  # the frames up to the episode's end, the last observation included
        del episode.frames[episode.steps + 1 :]


def _render(env: VectorEnv, batch: list[Episode], count: int) -> None:
    """The next video frame of each of the first `count` episodes (an AsyncVectorEnv renders them all)."""
    if count:
        frames = env.call("render")
        for i in range(count):
            batch[i].frames.append(np.asarray(frames[i]))


def _check_finite(observation: Any, reward: np.ndarray) -> None:
    if not np.all(np.isfinite(np.asarray(reward, dtype=np.float64))):
        raise EnvironmentFailure(f"the environment returned a NaN or infinite reward ({reward.tolist()})")
    values = observation.values() if isinstance(observation, dict) else [observation]
    for value in values:
        if isinstance(value, dict):
            _check_finite(value, np.zeros(1))
        elif np.issubdtype(np.asarray(value).dtype, np.floating) and not np.all(np.isfinite(value)):
            raise EnvironmentFailure("the environment returned a NaN or infinite observation")


@contextlib.contextmanager
def _failures(first: int) -> Iterator[None]:
    """Whatever the environment or the policy raises, as one line naming the episodes."""
    try:
        yield
    except EnvironmentFailure:
        raise
    except Exception as exc:
        text = " ".join(str(exc).split())[:300]
        raise EnvironmentFailure(f"episodes from {first} on failed: {type(exc).__name__}: {text}") from None


class _Timeout(BaseException):
    """Raised by the timer signal inside whatever the episode was running (not an Exception, so no
    `except Exception` of an environment swallows it)."""


@contextlib.contextmanager
def _time_limit(seconds: float, first: int) -> Iterator[None]:
    """Bound one batch of episodes to `seconds` with a SIGALRM timer (main thread only; elsewhere the
    caller's own bounds apply)."""
    if not _in_main_thread():
        yield
        return

    def expire(_signum: int, _frame: FrameType | None) -> None:
        raise _Timeout

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except _Timeout:
        raise EnvironmentFailure(
            f"episodes from {first} on took longer than --eval.episode_time_limit_s={seconds:g}: the "
            "environment hangs or is slower than the limit allows"
        ) from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
