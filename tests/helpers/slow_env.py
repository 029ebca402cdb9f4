"""A deliberately slow environment, registered with gymnasium as `SlowPendulum-v0`: the embedded swing-up
task whose steps wait `delay_s` each, and, with a `gate` path, wait until that path exists (bounded by
`gate_s`). Tests use the gate to hold an evaluation until a run has reached its end, so "training went on
while this checkpoint was being scored" is shown by what happened, not by timings. `crash_at` raises at
that step and `nan_at` returns a NaN reward there: the failures an evaluator must survive.

Run `--env.type=gym --env.task=helpers.slow_env:SlowPendulum-v0` with tests/ on PYTHONPATH."""

from __future__ import annotations

import os
import time
from typing import Any

import gymnasium as gym
import numpy as np

from trainer.evaluation.pendulum_env import PendulumEnv

FEATURES_MAP = '{"agent_pos": "observation.state"}'


class SlowPendulum(PendulumEnv):
    def __init__(
        self,
        delay_s: float = 0.0,
        gate: str = "",
        gate_s: float = 120.0,
        crash_at: int = -1,
        nan_at: int = -1,
    ) -> None:
        super().__init__(camera=False)
        self.delay_s, self.gate, self.gate_s = delay_s, gate, gate_s
        self.crash_at, self.nan_at, self.steps = crash_at, nan_at, 0

    def step(self, action: np.ndarray) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        time.sleep(self.delay_s)
        deadline = time.monotonic() + self.gate_s
        while self.gate and not os.path.exists(self.gate) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.steps += 1
        if self.steps == self.crash_at:
            raise RuntimeError("the simulator lost its contact solver")
        observation, reward, terminated, truncated, info = super().step(action)
        return observation, float("nan") if self.steps == self.nan_at else reward, terminated, truncated, info


gym.register("SlowPendulum-v0", entry_point=SlowPendulum)
