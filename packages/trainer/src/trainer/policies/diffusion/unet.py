"""The denoising network: LeRobot's 1-D conditional U-Net over the action chunk's time axis.

Every residual block is conditioned by FiLM on `cat([timestep embedding, global_cond])`: a Linear of
Mish(cond) gives per-channel scale (first half) and bias (second half), `out = scale * out + bias`.
The module tree and names are LeRobot's (`diffusion_step_encoder.1`, `down_modules.0.0.conv1.block.0`,
`cond_encoder.1`, ...), so its checkpoints load as they are. Two of LeRobot's quirks are kept because
its weights depend on them: every up level upsamples (so the first level's full-resolution skip is
never used), and `final_conv`'s GroupNorm has 8 groups whatever `n_groups` says.
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from trainer.policies.diffusion.config import FINAL_CONV_GROUPS, DiffusionConfig


class SinusoidalEmbedding(nn.Module):
    """The timestep as `cat(sin(t f), cos(t f))`, `f_k = exp(-k log(10000) / (half - 1))` (half - 1:
    LeRobot's, not the transformer paper's half)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, timesteps: torch.Tensor) -> torch.Tensor:
        half = self.dim // 2
        frequencies = torch.exp(torch.arange(half, device=timesteps.device) * -(math.log(10000) / (half - 1)))
        angles = timesteps.unsqueeze(-1) * frequencies.unsqueeze(0)
        return torch.cat((angles.sin(), angles.cos()), dim=-1)


class Conv1dBlock(nn.Module):
    """Conv1d (same length), GroupNorm, Mish."""

    def __init__(self, inp: int, out: int, kernel_size: int, n_groups: int) -> None:
        super().__init__()
        self.block = nn.Sequential(
            nn.Conv1d(inp, out, kernel_size, padding=kernel_size // 2),
            nn.GroupNorm(n_groups, out),
            nn.Mish(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class ResidualBlock1d(nn.Module):
    """Two conv blocks with FiLM between them and a residual (1x1 conv when the width changes)."""

    def __init__(self, inp: int, out: int, cond_dim: int, config: DiffusionConfig) -> None:
        super().__init__()
        self.out_channels = out
        self.scale_modulation = config.use_film_scale_modulation
        self.conv1 = Conv1dBlock(inp, out, config.kernel_size, config.n_groups)
        self.cond_encoder = nn.Sequential(
            nn.Mish(), nn.Linear(cond_dim, out * (2 if self.scale_modulation else 1))
        )
        self.conv2 = Conv1dBlock(out, out, config.kernel_size, config.n_groups)
        self.residual_conv: nn.Module = nn.Conv1d(inp, out, 1) if inp != out else nn.Identity()

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        out = self.conv1(x)
        film = self.cond_encoder(cond).unsqueeze(-1)
        if self.scale_modulation:
            out = film[:, : self.out_channels] * out + film[:, self.out_channels :]
        else:
            out = out + film
        return self.conv2(out) + self.residual_conv(x)


class ConditionalUnet1d(nn.Module):
    """(B, T, A) noisy actions, (B,) timesteps, (B, G) global conditioning -> (B, T, A) prediction."""

    def __init__(self, config: DiffusionConfig, action_dim: int, global_cond_dim: int) -> None:
        super().__init__()
        embed = config.diffusion_step_embed_dim
        self.gradient_checkpointing = config.gradient_checkpointing
        self.diffusion_step_encoder = nn.Sequential(
            SinusoidalEmbedding(embed), nn.Linear(embed, embed * 4), nn.Mish(), nn.Linear(embed * 4, embed)
        )
        cond_dim = embed + global_cond_dim
        dims = config.down_dims
        levels = [(action_dim, dims[0]), *itertools.pairwise(dims)]

        def block(inp: int, out: int) -> ResidualBlock1d:
            return ResidualBlock1d(inp, out, cond_dim, config)

        self.down_modules = nn.ModuleList(
            nn.ModuleList(
                [
                    block(inp, out),
                    block(out, out),
                    nn.Conv1d(out, out, 3, 2, 1) if index < len(levels) - 1 else nn.Identity(),
                ]
            )
            for index, (inp, out) in enumerate(levels)
        )
        self.mid_modules = nn.ModuleList([block(dims[-1], dims[-1]), block(dims[-1], dims[-1])])
        self.up_modules = nn.ModuleList(
            nn.ModuleList([block(inp * 2, out), block(out, out), nn.ConvTranspose1d(out, out, 4, 2, 1)])
            for out, inp in reversed(levels[1:])
        )
        self.final_conv = nn.Sequential(
            Conv1dBlock(dims[0], dims[0], config.kernel_size, FINAL_CONV_GROUPS),
            nn.Conv1d(dims[0], action_dim, 1),
        )

    def _run(self, block: nn.Module, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        if self.gradient_checkpointing and self.training:
            return checkpoint(block, x, cond, use_reentrant=False)
        return block(x, cond)

    def forward(self, x: torch.Tensor, timesteps: torch.Tensor, global_cond: torch.Tensor) -> torch.Tensor:
        x = x.transpose(1, 2)  # the 1-D convolutions run over time: (B, A, T)
        cond = torch.cat([self.diffusion_step_encoder(timesteps), global_cond], dim=-1)
        skips = []
        for level in self.down_modules:
            first, second, downsample = level.children()
            x = self._run(second, self._run(first, x, cond), cond)
            skips.append(x)
            x = downsample(x)
        for middle in self.mid_modules:
            x = self._run(middle, x, cond)
        for level in self.up_modules:
            first, second, upsample = level.children()
            x = torch.cat((x, skips.pop()), dim=1)
            x = upsample(self._run(second, self._run(first, x, cond), cond))
        return self.final_conv(x).transpose(1, 2)
