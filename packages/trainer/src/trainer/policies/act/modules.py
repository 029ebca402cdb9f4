"""ACT's layers as LeRobot computes them: attention with separate q/k/v/out projections (LeRobot's
`nn.MultiheadAttention` fuses the input projection, which LoRA cannot target), post-norm (or `pre_norm`)
encoder and decoder layers with positions added to queries and keys only, sinusoidal position
embeddings, and the online temporal ensembling of overlapping chunks."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from trainer.policies.act.config import ACTIVATIONS, ACTConfig


class ACTAttention(nn.Module):
    """Multi-head attention with separate q/k/v/out projections; `keep` masks keys (True = attend)."""

    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(dim, dim) for _ in range(4))

    def forward(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, keep: torch.Tensor | None = None
    ) -> torch.Tensor:
        b, n, d = query.shape

        def split(x: torch.Tensor) -> torch.Tensor:
            return x.view(b, x.shape[1], self.heads, -1).transpose(1, 2)

        mask = None if keep is None else keep[:, None, None, :]
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(
            split(self.q_proj(query)), split(self.k_proj(key)), split(self.v_proj(value)), mask, p
        )
        return self.out_proj(y.transpose(1, 2).reshape(b, n, d))


class _FeedForward(nn.Module):
    def __init__(self, cfg: ACTConfig) -> None:
        super().__init__()
        self.linear1 = nn.Linear(cfg.dim_model, cfg.dim_feedforward)
        self.linear2 = nn.Linear(cfg.dim_feedforward, cfg.dim_model)
        self.dropout = nn.Dropout(cfg.dropout)
        self.activation = ACTIVATIONS[cfg.feedforward_activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(self.dropout(self.activation(self.linear1(x))))


class ACTEncoderLayer(nn.Module):
    """Self-attention (positions on queries and keys) and feed-forward, each with a residual."""

    def __init__(self, cfg: ACTConfig) -> None:
        super().__init__()
        self.self_attn = ACTAttention(cfg.dim_model, cfg.n_heads, cfg.dropout)
        self.ffn = _FeedForward(cfg)
        self.norm1, self.norm2 = nn.LayerNorm(cfg.dim_model), nn.LayerNorm(cfg.dim_model)
        self.dropout1, self.dropout2 = nn.Dropout(cfg.dropout), nn.Dropout(cfg.dropout)
        self.pre_norm = cfg.pre_norm

    def forward(self, x: torch.Tensor, pos: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        h = self.norm1(x) if self.pre_norm else x
        x = x + self.dropout1(self.self_attn(h + pos, h + pos, h, keep))
        if self.pre_norm:
            return x + self.dropout2(self.ffn(self.norm2(x)))
        x = self.norm1(x)
        return self.norm2(x + self.dropout2(self.ffn(x)))


class ACTDecoderLayer(nn.Module):
    """Self-attention over the chunk's positions, cross-attention to the encoder, feed-forward."""

    def __init__(self, cfg: ACTConfig) -> None:
        super().__init__()
        self.self_attn = ACTAttention(cfg.dim_model, cfg.n_heads, cfg.dropout)
        self.multihead_attn = ACTAttention(cfg.dim_model, cfg.n_heads, cfg.dropout)
        self.ffn = _FeedForward(cfg)
        self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(cfg.dim_model) for _ in range(3))
        self.dropout1, self.dropout2, self.dropout3 = (nn.Dropout(cfg.dropout) for _ in range(3))
        self.pre_norm = cfg.pre_norm

    def forward(
        self, x: torch.Tensor, memory: torch.Tensor, pos: torch.Tensor, memory_pos: torch.Tensor
    ) -> torch.Tensor:
        h = self.norm1(x) if self.pre_norm else x
        x = x + self.dropout1(self.self_attn(h + pos, h + pos, h))
        h = self.norm2(x) if self.pre_norm else self.norm1(x)
        x = (x if self.pre_norm else h) + self.dropout2(
            self.multihead_attn(h + pos, memory + memory_pos, memory)
        )
        h = self.norm3(x) if self.pre_norm else self.norm2(x)
        x = (x if self.pre_norm else h) + self.dropout3(self.ffn(h))
        return x if self.pre_norm else self.norm3(x)


class ACTEncoder(nn.Module):
    def __init__(self, cfg: ACTConfig, layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(ACTEncoderLayer(cfg) for _ in range(layers))
        self.norm = nn.LayerNorm(cfg.dim_model) if cfg.pre_norm else nn.Identity()

    def forward(self, x: torch.Tensor, pos: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, pos, keep)
        return self.norm(x)


class ACTDecoder(nn.Module):
    def __init__(self, cfg: ACTConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(ACTDecoderLayer(cfg) for _ in range(cfg.n_decoder_layers))
        self.norm = nn.LayerNorm(cfg.dim_model)

    def forward(
        self, x: torch.Tensor, memory: torch.Tensor, pos: torch.Tensor, memory_pos: torch.Tensor
    ) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, memory, pos, memory_pos)
        return self.norm(x)


def sinusoidal_1d(positions: int, dim: int) -> torch.Tensor:
    """(positions, dim) fixed embedding: sin on even channels, cos on odd, periods up to 10000; in
    float64 throughout, then float32, so it equals LeRobot's numpy table (the buffer its checkpoints
    store, and ours write for it) bit for bit."""
    exponent = 2 * (torch.arange(dim, dtype=torch.float64) // 2) / dim
    angles = torch.arange(positions, dtype=torch.float64)[:, None] / 10000 ** exponent[None, :]
    return torch.where(torch.arange(dim) % 2 == 0, angles.sin(), angles.cos()).float()


def sinusoidal_2d(height: int, width: int, dim: int) -> torch.Tensor:
    """(dim, height, width) embedding of a feature map: half the channels encode the row, half the
    column, each position normalized to (0, 2*pi] (DETR's, as LeRobot's ACT uses)."""
    half = dim // 2
    scale = 2 * math.pi
    rows = torch.arange(1, height + 1, dtype=torch.float32) / (height + 1e-6) * scale
    cols = torch.arange(1, width + 1, dtype=torch.float32) / (width + 1e-6) * scale
    frequency = 10000 ** (2 * (torch.arange(half) // 2) / half)

    def embed(values: torch.Tensor) -> torch.Tensor:  # (n,) -> (n, half), sin/cos interleaved
        angles = values[:, None] / frequency
        return torch.stack((angles[:, 0::2].sin(), angles[:, 1::2].cos()), dim=-1).flatten(1)

    y = embed(rows)[:, None, :].expand(height, width, half)
    x = embed(cols)[None, :, :].expand(height, width, half)
    return torch.cat((y, x), dim=-1).permute(2, 0, 1)


class TemporalEnsembler:
    """The online form of ACT's temporal ensembling: each step's action is the weighted mean of what
    every chunk predicted for that step, weight exp(-coeff * i) with i = 0 the oldest chunk."""

    def __init__(self, coeff: float, chunk_size: int) -> None:
        self.weights = torch.exp(-coeff * torch.arange(chunk_size, dtype=torch.float64))
        self.cumulative = self.weights.cumsum(0)
        self.reset()

    def reset(self) -> None:
        self.mean: torch.Tensor | None = None  # (B, steps left, action_dim)
        self.count = torch.zeros(0, dtype=torch.long)  # predictions averaged into each step

    def update(self, chunk: torch.Tensor) -> torch.Tensor:
        chunk = chunk.double()
        if self.mean is None:
            self.mean, self.count = chunk, torch.ones(chunk.shape[1], dtype=torch.long)
        else:
            w, c = self.weights.to(chunk.device), self.cumulative.to(chunk.device)
            n = self.count.to(chunk.device)
            old = self.mean * c[n - 1][None, :, None] + chunk[:, :-1] * w[n][None, :, None]
            self.mean = torch.cat([old / c[n][None, :, None], chunk[:, -1:]], dim=1)
            self.count = torch.cat([(n + 1).clamp_max(len(w)), n.new_ones(1)]).cpu()
        action, self.mean, self.count = self.mean[:, 0], self.mean[:, 1:], self.count[1:]
        return action.float()
