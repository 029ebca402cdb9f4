"""A point mass pushed in the plane, registered with gymnasium as `PointPush-v0`: a 4-value agent
position (x, y, vx, vy) and a 3-value environment state (the target x, y and the distance to it), a
2-value action (the force). Its shapes are those of the ACT LeRobot wrote in
tests/fixtures/lerobot/checkpoint_act, so that checkpoint is scored in an environment as lerobot-eval
would score it. The reward is minus the distance to the target; the episode never ends early.

Run `--env.type=gym --env.task=helpers.point_env:PointPush-v0 --env.features_map=FEATURES_MAP` with
tests/ on PYTHONPATH."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

FEATURES_MAP = '{"agent_pos": "observation.state", "environment_state": "observation.environment_state"}'


class PointPush(gym.Env[dict[str, Any], np.ndarray]):
    metadata: dict[str, Any] = {"render_modes": ["rgb_array"], "render_fps": 10}  # noqa: RUF012 (gymnasium's)

    def __init__(self, render_mode: str = "rgb_array") -> None:
        self.render_mode = render_mode
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.observation_space = gym.spaces.Dict(
            {
                "agent_pos": gym.spaces.Box(-np.inf, np.inf, (4,), np.float32),
                "environment_state": gym.spaces.Box(-np.inf, np.inf, (3,), np.float32),
            }
        )
        self._agent = np.zeros(4, np.float32)
        self._target = np.zeros(2, np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        super().reset(seed=seed)
        self._agent = np.zeros(4, np.float32)
        self._target = self.np_random.uniform(-1.0, 1.0, 2).astype(np.float32)
        return self._observation(), {}

    def step(self, action: np.ndarray) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        force = np.clip(np.asarray(action, np.float32).reshape(2), -1.0, 1.0)
        velocity = self._agent[2:] + 0.1 * force
        self._agent = np.concatenate([self._agent[:2] + 0.1 * velocity, velocity]).astype(np.float32)
        distance = self._distance()
        return self._observation(), -distance, False, False, {"is_success": distance < 0.05}

    def render(self) -> np.ndarray:
        return np.zeros((16, 16, 3), np.uint8)

    def _distance(self) -> float:
        return float(np.linalg.norm(self._agent[:2] - self._target))

    def _observation(self) -> dict[str, Any]:
        state = np.array([*self._target, self._distance()], np.float32)
        return {"agent_pos": self._agent.copy(), "environment_state": state}


gym.register("PointPush-v0", entry_point=PointPush)
