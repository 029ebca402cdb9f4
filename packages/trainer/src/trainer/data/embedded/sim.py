"""The simulated control tasks and their scripted experts, on gymnasium's Pendulum-v1.

Two tasks share the pendulum:
- `swing_up` (the default, state only): Pendulum-v1 itself. The expert pumps energy into the pendulum
  until it carries the energy of the upright rest state, then an LQR controller catches and holds it.
- `target` (the camera task): each episode draws a target angle anywhere on the circle; the pendulum
  must reach and hold it. Gravity is lowered (g=2) so that every angle can be held within the torque
  limit, and the reward measures the distance to the target instead of to upright. The target is not
  in the state vector: it is drawn in the camera picture (`observation.images.top`, a small front view
  with the rod and the target, its direction also tinting the background), so a policy has to look to solve the task. The expert reads
  the target directly (privileged information); a policy gets only what a robot would: state and frame.

Each task has its language instruction (`instruction`), the `task` text a vision-language-action policy
reads with every frame and every rollout step, as a LeRobotDataset gives each frame's task.

Both experts are deterministic, so the demonstrations are the same on every machine, and need no network.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

ENV_ID = "Pendulum-v1"
EPISODE_STEPS = 200
MAX_TORQUE = 2.0
OBS_DIM = 3  # cos(theta), sin(theta), theta_dot
ACTION_DIM = 1
CAMERA = "observation.images.top"
FRAME_SIZE = 32  # pixels, square RGB

_G = 10.0  # Pendulum-v1: g=10, m=1, l=1, so theta_ddot = 3g/2 sin(theta) + 3 u
_E_UPRIGHT = _G / 2  # energy at rest upright, with E = theta_dot^2 / 6 + g/2 cos(theta)
_PUMP_GAIN = 1.5
_LQR_GAINS = (13.0, 3.5)  # closed loop theta'' = (15 - 3 k1) theta - 3 k2 theta': poles near -5
_CATCH_COS = 0.92

_TARGET_G = 2.0  # holding any angle needs at most g/2 = 1 of the 2 units of torque
_TARGET_STEPS = 100
_TARGET_GAINS = (3.0, 1.5)  # theta'' = -3 k1 e - 3 k2 theta': s^2 + 4.5 s + 9, damping 0.75


@dataclass(frozen=True)
class Observation:
    """What a controller sees at one step: the state vector, the camera frame (uint8 H x W x 3) on the
    camera task, and the target (privileged: only the scripted expert may read it)."""

    state: np.ndarray
    frame: np.ndarray | None = None
    target: float | None = None


Controller = Callable[[Observation], np.ndarray]


class Episode(NamedTuple):
    observations: np.ndarray  # (steps, OBS_DIM) float32
    actions: np.ndarray  # (steps, ACTION_DIM) float32
    total_return: float
    frames: np.ndarray | None  # (steps, H, W, 3) uint8 on the camera task


def expert_action(obs: Observation) -> np.ndarray:
    """The task's scripted expert: swing-up + LQR, or (with a target) PD control to it with gravity
    compensation."""
    cos_t, sin_t, theta_dot = (float(v) for v in obs.state)
    theta = math.atan2(sin_t, cos_t)  # 0 is upright
    if obs.target is not None:
        error = _wrap(theta - obs.target)
        torque = -(_TARGET_GAINS[0] * error + _TARGET_GAINS[1] * theta_dot) - _TARGET_G / 2 * math.sin(theta)
    elif cos_t > _CATCH_COS:
        torque = -(_LQR_GAINS[0] * theta + _LQR_GAINS[1] * theta_dot)
    else:
        energy = theta_dot**2 / 6 + _G / 2 * cos_t
        direction = 1.0 if theta_dot >= 0 else -1.0
        torque = _PUMP_GAIN * (_E_UPRIGHT - energy) * direction + 0.3 * direction
    return np.array([np.clip(torque, -MAX_TORQUE, MAX_TORQUE)], dtype=np.float32)


def rollout(controller: Controller, seed: int, noise: float = 0.0, camera: bool = False) -> Episode:
    """One full episode from the start state (and, with `camera`, the target) that `seed` draws.

    With `noise` > 0 the executed torque is perturbed (Gaussian, seeded) while the recorded action
    stays the controller's: demonstrations then also cover the states a slightly wrong policy
    reaches, and show how to recover from them (DART-style noise injection).
    """
    steps = episode_steps(camera)
    env = make_env(camera)
    state, _ = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    target = draw_target(seed) if camera else None
    observations, actions, frames, total = [], [], [], 0.0
    for _ in range(steps):
        state = np.asarray(state, dtype=np.float32)
        frame = render(state, target) if target is not None else None
        action = np.asarray(controller(Observation(state, frame, target)), dtype=np.float32)
        action = action.reshape(ACTION_DIM)
        observations.append(state)
        actions.append(action)
        if frame is not None:
            frames.append(frame)
        executed = np.clip(action + noise * rng.standard_normal(ACTION_DIM).astype(np.float32), -2, 2)
        before = state
        state, reward, terminated, truncated, _ = env.step(executed)
        if target is not None:  # the distance to the target replaces Pendulum-v1's distance to upright
            reward = target_reward(before, executed, target)
        total += float(reward)
        if terminated or truncated:
            break
    env.close()
    return Episode(np.stack(observations), np.stack(actions), total, np.stack(frames) if frames else None)


def make_env(camera: bool) -> Any:
    """The gymnasium Pendulum-v1 each task runs on (the camera task's with lowered gravity)."""
    import gymnasium as gym

    steps = episode_steps(camera)
    return gym.make(ENV_ID, max_episode_steps=steps, g=_TARGET_G if camera else _G)


def episode_steps(camera: bool) -> int:
    return _TARGET_STEPS if camera else EPISODE_STEPS


def draw_target(seed: int) -> float:
    """The camera task's target angle of the episode `seed` starts (not drawn from the stream gymnasium
    seeds its start state from, so the first draw of that stream stays the start angle)."""
    return float(np.random.default_rng([seed, 1]).uniform(-math.pi, math.pi))


def target_reward(state: np.ndarray, executed: np.ndarray, target: float) -> float:
    """The camera task's reward for the torque `executed` in `state`: the distance to the target
    replaces Pendulum-v1's distance to upright."""
    theta, theta_dot = math.atan2(float(state[1]), float(state[0])), float(state[2])
    return -(_wrap(theta - target) ** 2 + 0.1 * theta_dot**2 + 0.001 * float(executed[0]) ** 2)


def reached(state: np.ndarray, target: float | None) -> bool:
    """Whether the rod is held at its goal (upright, or the target): within 0.3 rad of it, turning
    slower than 1 rad/s (what a scored episode counts as a success)."""
    theta = math.atan2(float(state[1]), float(state[0]))
    return abs(_wrap(theta - (target or 0.0))) < 0.3 and abs(float(state[2])) < 1.0


def random_controller(seed: int) -> Controller:
    """Uniform random torques: the baseline a trained policy has to beat."""
    rng = np.random.default_rng(seed)
    return lambda _obs: rng.uniform(-MAX_TORQUE, MAX_TORQUE, size=ACTION_DIM).astype(np.float32)


# The language instruction of each task: the same words for every frame of it (the target itself is
# shown in the picture, not named in words).
_INSTRUCTIONS = {
    False: "swing the pendulum up and hold it upright",
    True: "turn the rod to the target the colour names and hold it there",
}


def instruction(camera: bool) -> str:
    """The task text of the camera task (`camera`) or of the swing-up."""
    return _INSTRUCTIONS[camera]


_ROWS, _COLS = np.mgrid[0:FRAME_SIZE, 0:FRAME_SIZE].astype(np.float32)


def render(state: np.ndarray, target: float) -> np.ndarray:
    """The camera frame (FRAME_SIZE x FRAME_SIZE x 3 uint8) of a camera riding on the rod: the rod
    points up from the pivot, the target is a yellow disc at its bearing from the rod on the circle the
    tip sweeps, and the background is tinted by that bearing (red by its cosine, blue by its sine), a
    cue a small network picks up in a few hundred steps, where the disc alone takes a convolutional
    trunk far longer to localize."""
    bearing = _wrap(target - math.atan2(float(state[1]), float(state[0])))
    centre, radius = (FRAME_SIZE - 1) / 2, FRAME_SIZE * 0.38
    tint = (128 + 100 * math.cos(bearing), 60, 128 + 100 * math.sin(bearing))
    frame = np.empty((FRAME_SIZE, FRAME_SIZE, 3), dtype=np.uint8)
    frame[...] = np.array(tint, dtype=np.float32).round().astype(np.uint8)
    row, col = centre - radius * math.cos(bearing), centre + radius * math.sin(bearing)
    frame[(_ROWS - row) ** 2 + (_COLS - col) ** 2 <= 2.5**2] = (240, 220, 40)
    rod = (np.abs(_COLS - centre) <= 1.0) & (centre >= _ROWS) & (centre - radius <= _ROWS)
    frame[rod] = (220, 220, 220)
    return frame


def _wrap(angle: float) -> float:
    return (angle + math.pi) % (2 * math.pi) - math.pi
