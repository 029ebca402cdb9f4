"""Evaluation benchmark (docs/evaluation.md): what the evaluator beside a run costs the training, and
what one episode of PushT and ALOHA takes.

1. Training steps/s with evaluation on vs off, same script, same flags except `--env.type`: one
   training process pinned to core 0 (`taskset`), the evaluator on its own core (`--eval.cpus=[1]`,
   where the run moves it as it starts), 8 pendulum episodes scored at each of the 6 checkpoints.
   Steps/s is read from the run's metrics.jsonl (samples_per_s over the logged windows / batch size).
   Goal: on / off >= 0.98.
2. Seconds per episode of PushT (gym-pusht) and ALOHA (gym-aloha, MUJOCO_GL=egl), a random policy
   stepped through the evaluator's own rollout loop (evaluation/episodes.py), one environment in this
   process: the environment's cost, which a small policy does not change.

Run: `python benchmarks/bench_eval.py [--steps 3000] [--ratio-runs 3] [--aloha-episodes 1]` (in `nox -s
bench`). Repeat the ratio (`--ratio-runs 8`): a virtual machine's host moves single runs by +-10 %
either way, so the alternated runs' mean ratio and its standard error is the figure; each run prints
the load average it started under. `--pusht-episodes 0` / `--aloha-episodes 0` skip an environment.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def train_steps_per_s(out: Path, steps: int, evaluate: bool) -> float:
    """One pinned training run; its mean steps/s over the logged windows after the first."""
    flags = [
        f"--output_dir={out}",
        f"--dataset.cache_dir={out.parent / 'cache'}",
        f"--steps={steps}",
        f"--save_freq={steps // 6}",
        f"--log_freq={steps // 30}",
        "--batch_size=32",
        "--num_workers=0",
        "--dataset.eval_episodes=0",
    ]
    if evaluate:
        flags += [
            "--env.type=pendulum",
            f"--env_eval_freq={steps // 6}",
            "--eval.n_episodes=8",
            "--eval.batch_size=1",
        ]
        flags += ["--eval.use_async_envs=false", "--eval.cpus=[1]", "--eval.max_episodes_rendered=1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = ["taskset", "-c", "0", sys.executable, "-m", "trainer.cli", "train", *flags]
    subprocess.run(command, env=env, check=True, capture_output=True, timeout=1800)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rates = [r["samples_per_s"] / 32 for r in records if r.get("event") == "train"][1:]
    if evaluate:  # the evaluator goes on after the run: let it finish before the next measurement
        deadline = time.monotonic() + 600
        while (
            not (out / "checkpoints" / f"{steps:06d}" / "eval.json").exists() and time.monotonic() < deadline
        ):
            time.sleep(1)
        time.sleep(2)
    return float(np.mean(rates))


def seconds_per_episode(env_type: str, episodes: int) -> float:
    """Episodes of a random policy in `env_type` through the evaluator's rollout loop."""
    from trainer.config.environment import AlohaEnv, PushtEnv
    from trainer.evaluation.environments import feature_names, make_vector_env
    from trainer.evaluation.episodes import Rollouts, run_episodes

    config = PushtEnv() if env_type == "pusht" else AlohaEnv()
    env = make_vector_env(config, 1, use_async=False)
    rng = np.random.default_rng(0)
    low, high = env.single_action_space.low, env.single_action_space.high
    plan = Rollouts(episodes, 0, config.episode_steps, 3600.0, 0, feature_names(config, {}), False)
    started = time.perf_counter()
    run_episodes(env, lambda raw: rng.uniform(low, high, (1, *low.shape)), lambda: None, plan)
    env.close()
    return (time.perf_counter() - started) / episodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--ratio-runs", type=int, default=1)
    parser.add_argument("--pusht-episodes", type=int, default=4)
    parser.add_argument("--aloha-episodes", type=int, default=1)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {"off": [], "on": []}
    for run in range(1, args.ratio_runs + 1):
        load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
        with tempfile.TemporaryDirectory(prefix="bench-eval-") as tmp:
            off = train_steps_per_s(Path(tmp) / "off", args.steps, evaluate=False)
            on = train_steps_per_s(Path(tmp) / "on", args.steps, evaluate=True)
        rates["off"].append(off)
        rates["on"].append(on)
        print(
            f"run {run}: training steps/s, evaluation off: {off:.2f}, on (evaluator on its own core): {on:.2f}; "
            f"ratio {on / off:.3f} (goal >= 0.98); load average at start {load}",
            flush=True,
        )
    if args.ratio_runs > 1:  # the host moves single runs by +-10 %: the paired ratios' mean and its error
        ratios = np.array(rates["on"]) / np.array(rates["off"])
        error = ratios.std(ddof=1) / np.sqrt(len(ratios))
        off, on = (float(np.median(rates[side])) for side in ("off", "on"))
        print(
            f"over {args.ratio_runs} alternated runs: on / off {ratios.mean():.3f} +- {error:.3f} (mean of the "
            f"runs' ratios +- its standard error); medians: off {off:.2f}, on {on:.2f} steps/s, {on / off:.3f}"
        )
    for env_type, episodes in (("pusht", args.pusht_episodes), ("aloha", args.aloha_episodes)):
        if not episodes:
            continue
        try:
            per_episode = seconds_per_episode(env_type, episodes)
        except Exception as exc:  # an extra not installed: say so, measure the rest
            print(f"{env_type}: not measured ({type(exc).__name__}: {exc})")
            continue
        print(
            f"{env_type}: {per_episode:.2f} s per episode (random policy, one environment, {episodes} episodes)"
        )


if __name__ == "__main__":
    os.environ.setdefault("MUJOCO_GL", "egl")
    main()
