"""A deliberately slow environment, registered with gymnasium as `SlowPendulum-v0`: the embedded swing-up
task whose steps wait `delay_s` each, and, with a `gate` path, wait until that path exists (bounded by
`gate_s`). Tests use the gate to hold an evaluation until a run has reached its end, so "training went on
while this checkpoint was being scored" is shown by what happened, not by timings. `crash_at` raises at
that step and `nan_at` returns a NaN reward there: the failures an evaluator must survive. `exit_at` ends
the whole process there (exit status 3), as a simulator that aborts does: the run must survive that.
`start_s` makes building the environment take that long (a renderer that never comes up).

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
        exit_at: int = -1,
        start_s: float = 0.0,
    ) -> None:
        time.sleep(start_s)
        super().__init__(camera=False)
        self.delay_s, self.gate, self.gate_s = delay_s, gate, gate_s
        self.crash_at, self.nan_at, self.exit_at, self.steps = crash_at, nan_at, exit_at, 0

    def step(self, action: np.ndarray) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        time.sleep(self.delay_s)
        deadline = time.monotonic() + self.gate_s
        while self.gate and not os.path.exists(self.gate) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.steps += 1
        if self.steps == self.exit_at:
            os._exit(3)
        if self.steps == self.crash_at:
            raise RuntimeError("the simulator lost its contact solver")
        observation, reward, terminated, truncated, info = super().step(action)
        return observation, float("nan") if self.steps == self.nan_at else reward, terminated, truncated, info


gym.register("SlowPendulum-v0", entry_point=SlowPendulum)
