"""Flow matching as LeRobot's VLA policies train and sample it (openpi's convention).

Training interpolates `x_t = t * noise + (1 - t) * actions` and regresses the velocity
`u_t = noise - actions`; sampling integrates the predicted velocity from t = 1 (noise) to t = 0 in
forward-Euler steps. The time enters the model through a sine-cosine embedding computed in float64.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch


def time_embedding(time: torch.Tensor, dim: int, min_period: float, max_period: float) -> torch.Tensor:
    """Sine-cosine embedding (B, dim) of scalar times, computed in float64 (float32 on MPS)."""
    dtype = torch.float32 if time.device.type == "mps" else torch.float64
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=dtype, device=time.device)
    period = min_period * (max_period / min_period) ** fraction
    angles = (1.0 / period * 2 * math.pi)[None, :] * time[:, None]
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)


def sample_time(
    batch: int, device: torch.device, alpha: float = 1.5, beta: float = 1.0, scale: float = 0.999,
    offset: float = 0.001,
) -> torch.Tensor:  # fmt: skip
    """LeRobot's training times: Beta(alpha, beta) * scale + offset (sampled on the CPU, which has
    the Dirichlet sampler every device lacks)."""
    dist = torch.distributions.Beta(torch.tensor(alpha), torch.tensor(beta))
    return (dist.sample((batch,)) * scale + offset).to(device=device, dtype=torch.float32)


def sample_noise(shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """Standard-normal float32 noise, the x_1 of flow matching."""
    return torch.normal(0.0, 1.0, size=shape, dtype=torch.float32, device=device)


def noisy_actions(
    actions: torch.Tensor, noise: torch.Tensor, time: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_t, u_t): the actions noised to time `time` (B,) and the velocity the model must predict."""
    t = time[:, None, None].to(actions.dtype)
    return t * noise + (1 - t) * actions, noise - actions


def euler(
    velocity: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], noise: torch.Tensor, steps: int
) -> torch.Tensor:
    """x_0 from x_1 = `noise` in `steps` Euler steps of `velocity(x_t, time)`, time (B,) float32 going
    1, 1 - 1/steps, ..."""
    dt = -1.0 / steps
    x_t = noise
    for step in range(steps):
        time = torch.tensor(1.0 + step * dt, dtype=torch.float32, device=noise.device).expand(noise.shape[0])
        x_t = x_t + dt * velocity(x_t, time)
    return x_t
