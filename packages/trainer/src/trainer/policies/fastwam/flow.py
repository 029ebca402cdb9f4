"""FastWAM's flow matching (LeRobot 0.6.1's `WanContinuousFlowMatchScheduler`): shifted timesteps on the
0..`num_train_timesteps` scale, the noisy sample and target, the loss weight per timestep and the Euler
sampler's schedule. Video and action each have their own schedule (config `video_scheduler`,
`action_scheduler`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


def shifted(u: torch.Tensor, shift: float) -> torch.Tensor:
    """Wan's shift of a uniform time: `shift u / (1 + (shift - 1) u)`."""
    return shift * u / (1.0 + (shift - 1.0) * u)


@dataclass(frozen=True)
class Schedule:
    """One expert's schedule: `train_shift` for training timesteps, `infer_shift` for sampling."""

    train_shift: float
    infer_shift: float
    num_train_timesteps: int

    @classmethod
    def of(cls, fields: dict[str, float]) -> Schedule:
        return cls(
            float(fields["train_shift"]), float(fields["infer_shift"]), int(fields["num_train_timesteps"])
        )

    def training_timestep(self, u: torch.Tensor) -> torch.Tensor:
        """Timesteps (B,) from uniform draws `u` in float32, as `sample_training_t` makes them."""
        return shifted(u.float(), self.train_shift) * float(self.num_train_timesteps)

    def noisy(self, clean: torch.Tensor, noise: torch.Tensor, timestep: torch.Tensor) -> torch.Tensor:
        """`(1 - s) x + s noise` with `s = timestep / num_train_timesteps` per sample."""
        sigma = (timestep / float(self.num_train_timesteps)).to(clean.device, clean.dtype)
        sigma = sigma.view(-1, *([1] * (clean.ndim - 1)))
        return (1 - sigma) * clean + sigma * noise

    def loss_weight(self, timestep: torch.Tensor) -> torch.Tensor:
        """`(exp(-2((t - N/2) / N)^2) - y_min) / (mean(y - y_min) + 1e-10)`, y_min and the mean over
        the N training timesteps in float64."""
        steps = self.num_train_timesteps
        grid = shifted(
            torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64)[:-1], self.train_shift
        ) * float(steps)
        y = torch.exp(-2.0 * ((grid - steps / 2.0) / steps) ** 2)
        y_min = float(y.min().item())
        norm = float((y - y_min).mean().item())
        t = timestep.to(torch.float32)
        return (torch.exp(-2.0 * ((t - steps / 2.0) / float(steps)) ** 2) - y_min) / (norm + 1e-10)

    def sampling(self, steps: int, shift: float | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(timesteps, deltas), float32: sigmas `shifted(linspace(1, 0, steps + 1)[:steps])` in float64,
        timesteps `sigma x N`, deltas `sigma_next - sigma` with a last sigma of 0."""
        uniform = np.linspace(1, 0, steps + 1)[:steps]  # float64, as Wan's get_sampling_sigmas
        shift = self.infer_shift if shift is None else float(shift)
        sigma = torch.as_tensor(shift * uniform / (1 + (shift - 1) * uniform), dtype=torch.float32)
        following = torch.cat([sigma[1:], sigma.new_zeros(1)])
        return sigma * float(self.num_train_timesteps), following - sigma
