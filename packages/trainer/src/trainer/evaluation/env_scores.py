"""A policy scored in its environment, with lerobot-eval's figures under lerobot-eval's names.

`score_policy` runs `--eval.n_episodes` episodes (`episodes.py`) and returns the record lerobot-eval
writes as `eval_info.json`: `overall` (`avg_sum_reward`, `avg_max_reward`, `pc_success`, `n_episodes`,
`eval_s`, `eval_ep_s`, `video_paths`), `per_group` and `per_task` (these environments have one task
each), and `per_episode` (`episode_ix`, `sum_reward`, `max_reward`, `success`, `seed`). The first
`--eval.max_episodes_rendered` episodes are written as mp4 videos, named by paths relative to where the
record is written.

`score_step` scores a committed step of a run and writes the record into it (`<step>/eval.json`, the
videos in `<step>/eval_videos/`), with the step, the environment and the weights; an evaluation that
fails (the environment crashed, hung or returned NaN; the policy cannot act there; the step's files are
damaged) writes the one line
why in place of the figures, so a follower counts the step as done and never retries it forever.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import ckpt_tools
from ckpt_tools import layout
from trainer.config.environment import EnvConfig, EnvEvalConfig
from trainer.data.dataset import TASK_KEY
from trainer.errors import ConfigError
from trainer.evaluation.environments import check_features, feature_names, make_vector_env
from trainer.evaluation.episodes import EnvironmentFailure, Episode, Rollouts, run_episodes, time_limit
from trainer.evaluation.inference import LoadedPolicy, load_policy
from trainer.evaluation.videos import write_video

FIGURES = ("avg_sum_reward", "avg_max_reward", "pc_success")


@dataclass(frozen=True)
class EnvScoring:
    """Everything scoring needs besides the policy: the environment, `--eval.*`, the first episode's
    seed (the run's `--seed`, as lerobot-train starts its evaluations) and the run's `--rename_map`."""

    env: EnvConfig
    eval: EnvEvalConfig
    seed: int
    rename_map: Mapping[str, str]


def score_policy(loaded: LoadedPolicy, scoring: EnvScoring, out_dir: str, videos: str) -> dict[str, Any]:
    """Roll `loaded` out and return lerobot-eval's record; its videos go to `out_dir/videos/`.
    Raises `EnvironmentFailure` or `ConfigError` (one line each) when no score can be had."""
    env_config, settings = scoring.env, scoring.eval
    check_features(env_config, loaded.input_features, scoring.rename_map)
    started = time.monotonic()
    with time_limit(settings.episode_time_limit_s, "starting the environments"):
        env = make_vector_env(env_config, settings.environments(), settings.use_async_envs)
    plan = Rollouts(
        n_episodes=settings.n_episodes,
        start_seed=scoring.seed,
        max_steps=env_config.episode_steps,
        time_limit_s=settings.episode_time_limit_s,
        rendered=settings.max_episodes_rendered,
        names=feature_names(env_config, scoring.rename_map),
        reads_task=TASK_KEY in loaded.input_features,
    )
    try:
        episodes = run_episodes(env, lambda raw: loaded.select_action(raw).cpu().numpy(), loaded.reset, plan)
    finally:
        env.close(terminate=True) if settings.use_async_envs and env.num_envs > 1 else env.close()
    paths = [f"{videos}/eval_episode_{e.index}.mp4" for e in episodes if e.frames]
    for episode, path in zip((e for e in episodes if e.frames), paths, strict=True):
        write_video(layout.join(out_dir, path), episode.frames, env_config.fps)
    return lerobot_record(episodes, env_config, time.monotonic() - started, paths)


def lerobot_record(
    episodes: Sequence[Episode], env: EnvConfig, seconds: float, video_paths: list[str]
) -> dict[str, Any]:
    """lerobot-eval's `eval_info.json` record of `episodes`, with their per-episode figures."""
    sums = [e.sum_reward for e in episodes]
    maxes = [e.max_reward for e in episodes]
    successes = [e.success for e in episodes]
    figures = {
        "avg_sum_reward": float(np.nanmean(sums)),
        "avg_max_reward": float(np.nanmean(maxes)),
        "pc_success": float(np.nanmean(successes) * 100),
        "n_episodes": len(episodes),
        "video_paths": video_paths,
    }
    timing = {"eval_s": seconds, "eval_ep_s": seconds / max(1, len(episodes))}
    metrics = {"sum_rewards": sums, "max_rewards": maxes, "successes": successes, "video_paths": video_paths}
    return {
        "env": env.type,
        "task": env.task,
        "per_episode": [e.record() for e in episodes],
        "per_task": [{"task_group": env.type, "task_id": 0, "metrics": metrics}],
        "per_group": {env.type: figures},
        "overall": {**figures, **timing},
    }


def score_step(step_dir: str, scoring: EnvScoring, device: str, allowed: Sequence[str]) -> dict[str, Any]:
    """Score the committed step `step_dir` and write its eval.json (and videos); returns what was
    written: the figures, or the one line why there are none (`error`)."""
    step = ckpt_tools.read_training_step(step_dir).step
    try:
        loaded = load_policy(step_dir, device, allow_types=allowed)
        record = {
            **score_policy(loaded, scoring, step_dir, layout.EVAL_VIDEOS_DIR),
            "weights": loaded.weights,
        }
    except (EnvironmentFailure, ConfigError, ckpt_tools.CheckpointError) as exc:  # a damaged step too
        record = {"env": scoring.env.type, "task": scoring.env.task, "error": " ".join(str(exc).split())}
    return ckpt_tools.training.write_scores(step_dir, {"step": step, **record})
