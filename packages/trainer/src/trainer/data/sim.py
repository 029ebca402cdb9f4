"""The simulated control task and its scripted expert: gymnasium's Pendulum-v1 swing-up.

The expert pumps energy into the pendulum until it carries the energy of the upright rest state, then
an LQR controller catches and holds it upright. It is deterministic, so the demonstrations it writes
are the same on every machine, and needs no network.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

ENV_ID = "Pendulum-v1"
EPISODE_STEPS = 200
MAX_TORQUE = 2.0
OBS_DIM = 3  # cos(theta), sin(theta), theta_dot
ACTION_DIM = 1

_G = 10.0  # Pendulum-v1: g=10, m=1, l=1, so theta_ddot = 3g/2 sin(theta) + 3 u
_E_UPRIGHT = _G / 2  # energy at rest upright, with E = theta_dot^2 / 6 + g/2 cos(theta)
_PUMP_GAIN = 1.5
_LQR_GAINS = (13.0, 3.5)  # closed loop theta'' = (15 - 3 k1) theta - 3 k2 theta': poles near -5
_CATCH_COS = 0.92

Controller = Callable[[np.ndarray], np.ndarray]


def expert_action(obs: np.ndarray) -> np.ndarray:
    """Energy-shaping swing-up far from upright, LQR near it."""
    cos_t, sin_t, theta_dot = (float(v) for v in obs)
    theta = math.atan2(sin_t, cos_t)  # 0 is upright
    if cos_t > _CATCH_COS:
        torque = -(_LQR_GAINS[0] * theta + _LQR_GAINS[1] * theta_dot)
    else:
        energy = theta_dot**2 / 6 + _G / 2 * cos_t
        direction = 1.0 if theta_dot >= 0 else -1.0
        torque = _PUMP_GAIN * (_E_UPRIGHT - energy) * direction + 0.3 * direction
    return np.array([np.clip(torque, -MAX_TORQUE, MAX_TORQUE)], dtype=np.float32)


def rollout(controller: Controller, seed: int, noise: float = 0.0) -> tuple[np.ndarray, np.ndarray, float]:
    """One full episode from the start state that `seed` draws: (observations, actions, return).

    With `noise` > 0 the executed torque is perturbed (Gaussian, seeded) while the recorded action
    stays the controller's: demonstrations then also cover the states a slightly wrong policy
    reaches, and show how to recover from them (DART-style noise injection).
    """
    import gymnasium as gym

    env = gym.make(ENV_ID, max_episode_steps=EPISODE_STEPS)
    obs, _ = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    observations, actions, total = [], [], 0.0
    for _ in range(EPISODE_STEPS):
        action = np.asarray(controller(np.asarray(obs, dtype=np.float32)), dtype=np.float32)
        action = action.reshape(ACTION_DIM)
        observations.append(np.asarray(obs, dtype=np.float32))
        actions.append(action)
        executed = action + noise * rng.standard_normal(ACTION_DIM).astype(np.float32)
        obs, reward, terminated, truncated, _ = env.step(np.clip(executed, -MAX_TORQUE, MAX_TORQUE))
        total += float(reward)
        if terminated or truncated:
            break
    env.close()
    return np.stack(observations), np.stack(actions), total


def random_controller(seed: int) -> Controller:
    """Uniform random torques: the baseline a trained policy has to beat."""
    rng = np.random.default_rng(seed)
    return lambda _obs: rng.uniform(-MAX_TORQUE, MAX_TORQUE, size=ACTION_DIM).astype(np.float32)
