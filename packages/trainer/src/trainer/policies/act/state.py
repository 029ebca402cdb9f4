"""`act_state`: the state-only action-chunking transformer that `--policy.type=act` was before ACT became
LeRobot's ACT (policies/act/).

Kept so that checkpoints written before that change still load, evaluate, resume and fine-tune: their
config.json says `type: act` with this architecture's fields (`dim`, `heads`, `chunk`, ...), and
`upgrade_policy_config` (policies/common/pretrained.py) maps such a config to this type wherever a saved policy config is read. Its
weight names are unchanged; its layer classes are renamed so that `StateEncoderLayer`/`StateDecoderLayer`
name LeRobot's layers.

The encoder reads the observation as one token plus learned context tokens; the decoder turns one
learned query per future step into a chunk of actions (L1 loss on the non-padded steps). At run time
`select_action` executes only the first action of each predicted chunk (receding horizon). The encoder
and decoder layers are the FSDP wrap units.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from trainer.data.dataset import ACTION_KEY, OBS_KEY, PAD_KEY
from trainer.errors import ConfigError
from trainer.policies.common.base import Policy, PolicyConfig


@PolicyConfig.register_subclass("act_state")
@dataclass
class ACTStateConfig(PolicyConfig):
    """State-only action-chunking transformer (the `act` of earlier releases)."""

    dim: int = 32
    """Model width."""
    heads: int = 4
    """Attention heads."""
    ffn_dim: int = 64
    """Feed-forward hidden width."""
    encoder_layers: int = 2
    """Encoder depth."""
    decoder_layers: int = 1
    """Decoder depth."""
    context_tokens: int = 2
    """Learned tokens the encoder attends over beside the observation token."""
    chunk: int = 5
    """Actions predicted per observation."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dim % self.heads:
            raise ConfigError(f"--policy.dim={self.dim} must be divisible by --policy.heads={self.heads}")
        if min(self.encoder_layers, self.decoder_layers, self.chunk) < 1:
            raise ConfigError(
                "--policy.encoder_layers, --policy.decoder_layers and --policy.chunk must be >= 1"
            )

    @property
    def chunk_size(self) -> int:
        return self.chunk

    def policy_class(self) -> type[Policy]:
        return ACTStatePolicy


class _Attention(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.dropout = dropout
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q = self.q(x).view(b, n, self.heads, -1).transpose(1, 2)
        k, v = self.kv(context).view(b, context.shape[1], 2, self.heads, -1).permute(2, 0, 3, 1, 4)
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p)
        return self.out(y.transpose(1, 2).reshape(b, n, d))


def _ffn(cfg: ACTStateConfig) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(cfg.dim, cfg.ffn_dim), nn.GELU(), nn.Dropout(cfg.dropout), nn.Linear(cfg.ffn_dim, cfg.dim)
    )


class StateEncoderLayer(nn.Module):
    """Pre-norm self-attention and feed-forward."""

    def __init__(self, cfg: ACTStateConfig) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(cfg.dim), nn.LayerNorm(cfg.dim)
        self.attn = _Attention(cfg.dim, cfg.heads, cfg.dropout)
        self.ffn = _ffn(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.drop(self.attn(h, h))
        return x + self.drop(self.ffn(self.norm2(x)))


class StateDecoderLayer(nn.Module):
    """Pre-norm self-attention over the action queries, cross-attention to the encoder, feed-forward."""

    def __init__(self, cfg: ACTStateConfig) -> None:
        super().__init__()
        self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(cfg.dim) for _ in range(3))
        self.self_attn = _Attention(cfg.dim, cfg.heads, cfg.dropout)
        self.cross_attn = _Attention(cfg.dim, cfg.heads, cfg.dropout)
        self.ffn = _ffn(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.drop(self.self_attn(h, h))
        x = x + self.drop(self.cross_attn(self.norm2(x), memory))
        return x + self.drop(self.ffn(self.norm3(x)))


class ACTStatePolicy(Policy):
    _fsdp_wrap_modules: ClassVar[tuple[str, ...]] = ("StateEncoderLayer", "StateDecoderLayer")
    _fsdp_forward_methods: ClassVar[tuple[str, ...]] = ("select_action",)

    def peft_target_modules(self) -> tuple[str, ...]:
        """LoRA on every attention projection."""
        return ("q", "kv", "out")

    def __init__(self, config: ACTStateConfig) -> None:
        super().__init__(config)
        self.obs_proj = nn.Linear(config.obs_dim, config.dim)
        self.context = nn.Parameter(torch.randn(config.context_tokens, config.dim) * 0.02)
        self.queries = nn.Parameter(torch.randn(config.chunk, config.dim) * 0.02)
        self.encoder = nn.ModuleList(StateEncoderLayer(config) for _ in range(config.encoder_layers))
        self.decoder = nn.ModuleList(StateDecoderLayer(config) for _ in range(config.decoder_layers))
        # A Sequential, not a direct LayerNorm child: accelerate carves a policy's direct Norm
        # children into their own FSDP unit.
        self.head = nn.Sequential(nn.LayerNorm(config.dim), nn.Linear(config.dim, config.action_dim))

    def reset_parameters(self) -> None:
        """The policy's own parameters, drawn as `__init__` draws them (a meta build calls this)."""
        with torch.no_grad():
            self.context.normal_(std=0.02)
            self.queries.normal_(std=0.02)

    def _predict(self, obs: torch.Tensor) -> torch.Tensor:
        b = obs.shape[0]
        tokens = torch.cat([self.obs_proj(obs)[:, None], self.context.expand(b, -1, -1)], dim=1)
        for layer in self.encoder:
            tokens = layer(tokens)
        # Each action query starts from the encoded observation: a direct path from state to action
        # that the cross-attention then refines.
        x = self.queries.expand(b, -1, -1) + tokens[:, :1]
        for layer in self.decoder:
            x = layer(x, tokens)
        return self.head(x)

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        pred = self._predict(batch[OBS_KEY])
        valid = (~batch[PAD_KEY]).unsqueeze(-1).to(pred.dtype)
        l1 = (pred - batch[ACTION_KEY]).abs() * valid
        loss = l1.sum() / (valid.sum() * pred.shape[-1]).clamp_min(1)
        return loss, {"l1_first_action": l1[:, 0].mean().detach()}

    @torch.no_grad()
    def select_action(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self._predict(batch[OBS_KEY])[:, 0]
