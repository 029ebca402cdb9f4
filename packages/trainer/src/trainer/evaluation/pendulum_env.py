"""The embedded pendulum tasks (data/embedded/sim.py) as gymnasium environments, for `--env.type=pendulum`.

Importing this module registers `trainer/Pendulum-v0` (swing up and hold) and
`trainer/PendulumCamera-v0` (reach the target the camera frame shows);
`gymnasium.make("trainer.evaluation.pendulum_env:trainer/Pendulum-v0")` imports it first, in an AsyncVectorEnv's worker processes too. Observations are keyed as LeRobot's environments
key theirs (`agent_pos`, `pixels/top`), an episode started with seed s is the one `sim.rollout` runs
with seed s, and the last step's `info["is_success"]` says whether the rod was held at its goal.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from trainer.data.embedded import sim

VIDEO_SCALE = 8  # the 32x32 picture drawn 256x256 in videos


class PendulumEnv(gym.Env[dict[str, Any], np.ndarray]):
    """One pendulum task; `camera` picks the target task with its frame."""

    metadata: dict[str, Any] = {"render_modes": ["rgb_array"], "render_fps": 20}  # noqa: RUF012 (gymnasium's)

    def __init__(self, camera: bool = False, render_mode: str = "rgb_array") -> None:
        self.camera, self.render_mode = camera, render_mode
        self.task_description = sim.instruction(camera)
        self._env = sim.make_env(camera)
        self.action_space = gym.spaces.Box(-sim.MAX_TORQUE, sim.MAX_TORQUE, (sim.ACTION_DIM,), np.float32)
        spaces: dict[str, gym.Space[Any]] = {
            "agent_pos": gym.spaces.Box(-np.inf, np.inf, (sim.OBS_DIM,), np.float32)
        }
        if camera:
            frame = gym.spaces.Box(0, 255, (sim.FRAME_SIZE, sim.FRAME_SIZE, 3), np.uint8)
            spaces["pixels"] = gym.spaces.Dict({"top": frame})
        self.observation_space = gym.spaces.Dict(spaces)
        self._state = np.zeros(sim.OBS_DIM, np.float32)
        self._target: float | None = None

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        super().reset(seed=seed)
        state, _ = self._env.reset(seed=seed)
        self._state = np.asarray(state, np.float32)
        self._target = sim.draw_target(seed if seed is not None else 0) if self.camera else None
        return self._observation(), {}

    def step(self, action: np.ndarray) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        executed = np.clip(
            np.asarray(action, np.float32).reshape(sim.ACTION_DIM), -sim.MAX_TORQUE, sim.MAX_TORQUE
        )
        before = self._state
        state, reward, terminated, truncated, _ = self._env.step(executed)
        self._state = np.asarray(state, np.float32)
        if self._target is not None:
            reward = sim.target_reward(before, executed, self._target)
        info = {"is_success": sim.reached(self._state, self._target)}
        return self._observation(), float(reward), bool(terminated), bool(truncated), info

    def render(self) -> np.ndarray:
        """The camera's picture of the rod (with the target, or upright as the goal), enlarged."""
        frame = sim.render(self._state, self._target if self._target is not None else 0.0)
        return np.kron(frame, np.ones((VIDEO_SCALE, VIDEO_SCALE, 1), np.uint8))

    def close(self) -> None:
        self._env.close()

    def _observation(self) -> dict[str, Any]:
        observation: dict[str, Any] = {"agent_pos": self._state.copy()}
        if self._target is not None:
            observation["pixels"] = {"top": sim.render(self._state, self._target)}
        return observation


ENTRY_POINT = f"{__name__}:PendulumEnv"
gym.register("trainer/Pendulum-v0", entry_point=ENTRY_POINT, kwargs={"camera": False})
gym.register("trainer/PendulumCamera-v0", entry_point=ENTRY_POINT, kwargs={"camera": True})
