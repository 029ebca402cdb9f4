"""One layer of PaliGemma's Gemma and one of the action expert, run together (LeRobot's `pi_gemma` module
and `compute_layer_complete`).

A `JointLayer` owns layer i of both stacks and its forward() runs them: each stream (the prefix:
cameras and task; the suffix: state and action tokens) through its own norm and q/k/v projections, one
attention over the streams present (the prefix's keys and values cached from the prefill when the
prefix is absent), then each stream's o_proj, gated residual, norm, MLP and gated residual. LeRobot
reads the layers' weights without calling their forward(), which FSDP's hooks never see; here the
joint layer is the unit FSDP wraps, and its forward() is what runs.

The norms are LeRobot's `PiGemmaRMSNorm`: `x * rsqrt(mean(x^2) + eps) * (1 + w)` with the variance in
float32, or with a condition (pi0.5's action expert, adaRMS) `* (1 + scale) + shift` and a `gate` on
the residual, all three from `dense(cond)`. RoPE is transformers' Gemma rotary embedding (rotate-half,
cos/sin from `GemmaRotaryEmbedding`), attention eager in float32 (policies/vla/attention.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from trainer.policies.vla.attention import attend

# (keys, values) of the prefix at one layer, (B, L, KV heads, head_dim), keys after RoPE.
KeyValue = tuple[torch.Tensor, torch.Tensor]


class AdaptiveDense(nn.Linear):
    """The adaptive norm's condition -> (scale, shift, gate) map: a Linear whose weight starts at zero
    (LeRobot's init; the bias keeps torch's), so the norm starts as the plain one."""

    def reset_parameters(self) -> None:
        super().reset_parameters()
        nn.init.zeros_(self.weight)


class PiRMSNorm(nn.Module):
    """Gemma's RMSNorm, or with `cond_dim` the adaptive one whose scale, shift and gate come from a
    condition vector."""

    def __init__(self, dim: int, eps: float, cond_dim: int | None = None) -> None:
        super().__init__()
        self.eps = eps
        self.dense = None if cond_dim is None else AdaptiveDense(cond_dim, 3 * dim)
        if self.dense is None:
            self.weight = nn.Parameter(torch.zeros(dim))

    def reset_parameters(self) -> None:
        """The weight at zero (Gemma's `1 + w` starts as the identity scale); the dense has its own."""
        if self.dense is None:
            nn.init.zeros_(self.weight)

    def forward(
        self, x: torch.Tensor, cond: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(normed x, the residual's gate or None)."""
        normed = x * torch.rsqrt(torch.mean(torch.square(x.float()), dim=-1, keepdim=True) + self.eps)
        if self.dense is None:
            return (normed * (1.0 + self.weight.float())).type_as(x), None
        if cond is None:
            raise ValueError("an adaptive RMSNorm needs its condition (the flow-matching time's embedding)")
        scale, shift, gate = self.dense(cond)[:, None, :].chunk(3, dim=-1)
        # the gate leaves the module (an FSDP unit) as a tensor of its own: a unit must not return a view
        return (normed * (1 + scale.float()) + shift.float()).to(x.dtype), gate.to(x.dtype).contiguous()


class IdleRMSNorm(nn.Module):
    """A norm LeRobot's checkpoints hold but no output reads (PaliGemma's final norm, its last layer's
    post-attention norm): its weight kept, frozen, never run, and no PiRMSNorm, so it is no FSDP unit
    of its own (a unit whose forward never runs would never be gathered)."""

    def __init__(self, dim: int, eps: float, cond_dim: int | None = None) -> None:
        super().__init__()
        assert cond_dim is None, "an idle norm is a plain one"
        self.weight = nn.Parameter(torch.zeros(dim))

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.weight)


def gated(residual: torch.Tensor, update: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
    return residual + update if gate is None else residual + update * gate


class DecoderLayer(nn.Module):
    """A Gemma decoder layer under LeRobot's names (`self_attn.{q,k,v,o}_proj`, `mlp`, two norms),
    built from transformers' GemmaAttention and GemmaMLP; its steps are called by `JointLayer`."""

    def __init__(self, gemma_config: Any, index: int, cond_dim: int | None, idle: bool = False) -> None:
        super().__init__()
        from transformers.models.gemma import modeling_gemma

        self.self_attn = modeling_gemma.GemmaAttention(gemma_config, index)
        self.mlp = modeling_gemma.GemmaMLP(gemma_config)
        width, eps = gemma_config.hidden_size, gemma_config.rms_norm_eps
        self.input_layernorm = PiRMSNorm(width, eps, cond_dim)
        post = IdleRMSNorm if idle else PiRMSNorm  # `idle`: nothing reads this layer's output
        self.post_attention_layernorm = post(width, eps, cond_dim)

    def project(
        self, hidden: torch.Tensor, cond: torch.Tensor | None, queries: bool
    ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(queries or None, keys, values), each (B, L, heads, head_dim) before RoPE, and the gate."""
        attn = self.self_attn
        h, gate = self.input_layernorm(hidden, cond)
        h = h.to(attn.q_proj.weight.dtype)
        shape = (*h.shape[:-1], -1, attn.head_dim)
        q = attn.q_proj(h).view(shape) if queries else None
        return q, attn.k_proj(h).view(shape), attn.v_proj(h).view(shape), gate

    def finish(
        self,
        attended: torch.Tensor,
        hidden: torch.Tensor,
        gate: torch.Tensor | None,
        cond: torch.Tensor | None,
    ) -> torch.Tensor:
        """o_proj and the gated residual, then the norm, the MLP and the second gated residual."""
        o_proj = self.self_attn.o_proj
        out = gated(hidden, o_proj(attended.to(o_proj.weight.dtype)), gate)
        h, gate = self.post_attention_layernorm(out, cond)
        return gated(out, self.mlp(h.to(self.mlp.up_proj.weight.dtype)), gate)


@dataclass
class _Stream:
    """One stream's part of a joint layer: its layer, input, condition, and its queries (None where
    nothing reads its output), keys and values after RoPE, and residual gate."""

    layer: DecoderLayer
    hidden: torch.Tensor
    cond: torch.Tensor | None
    query: torch.Tensor | None
    key: torch.Tensor
    value: torch.Tensor
    gate: torch.Tensor | None


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE of x (B, L, H, D) with cos/sin (B, L, D) as transformers' Gemma applies it."""
    from transformers.models.gemma.modeling_gemma import rotate_half

    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    return x * cos + rotate_half(x) * sin


class JointLayer(nn.Module):
    """Layer i of PaliGemma's Gemma (`paligemma`) and of the action expert (`expert`): the FSDP unit.

    Each stream attends to the keys before it and its own: the prefix to itself, the suffix to the
    prefix and itself. LeRobot runs one attention over [prefix; suffix] in which the prefix's view of
    the suffix is masked out; here the prefix's attention never reads the suffix, so its outputs depend
    on no suffix token: a frozen PaliGemma (train_expert_only) then keeps no activations for the
    backward pass and the backward never runs through it. The last layer's prefix output can reach
    nothing (pi0 reads the expert's output only), so there the prefix gives its keys and values alone."""

    def __init__(self, vlm_config: Any, expert_config: Any, index: int, last: bool, adarms: bool) -> None:
        super().__init__()
        self.paligemma = DecoderLayer(vlm_config, index, None, idle=last)
        self.expert = DecoderLayer(expert_config, index, expert_config.hidden_size if adarms else None)
        self.heads: int = vlm_config.num_attention_heads
        self.last = last

    def forward(
        self,
        prefix: torch.Tensor | None,
        suffix: torch.Tensor | None,
        mask: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cond: torch.Tensor | None = None,
        cache: KeyValue | None = None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, KeyValue | None]:
        """(prefix out, suffix out, the prefix's keys and values). `mask` (B, queries, keys) and
        `cos`/`sin` (B, L, head_dim) cover the tokens present, prefix first; with `cache` (sampling)
        the prefix is absent and its keys and values come from the prefill."""
        streams: list[_Stream | None] = []
        start = 0
        for layer, hidden, c in ((self.paligemma, prefix, None), (self.expert, suffix, cond)):
            if hidden is None:
                streams.append(None)
                continue
            end = start + hidden.shape[1]
            rope = cos[:, start:end], sin[:, start:end]
            q, k, v, gate = layer.project(hidden, c, queries=not (self.last and layer is self.paligemma))
            query = None if q is None else rotate(q, *rope)
            streams.append(_Stream(layer, hidden, c, query, rotate(k, *rope), v, gate))
            start = end
        first = streams[0]
        # the prefix's values leave the unit as a tensor of their own (`view` of v_proj's output otherwise)
        filled = None if first is None else (first.key, first.value.clone())
        keys, values = ([cache[0]], [cache[1]]) if cache is not None else ([], [])
        outs: list[torch.Tensor | None] = []
        row = 0
        for stream in streams:
            if stream is None:
                outs.append(None)
                continue
            keys.append(stream.key)
            values.append(stream.value)
            n = stream.hidden.shape[1]
            if stream.query is None:  # the prefill's last layer: its keys and values are all it gives
                outs.append(None)
            else:  # this stream's queries against the keys so far (the cache's, the prefix's, its own)
                seen = torch.cat(keys, dim=1)
                rows = mask[:, row : row + n, : seen.shape[1]]
                attended = attend(stream.query, seen, torch.cat(values, dim=1), rows, self.heads)
                outs.append(stream.layer.finish(attended, stream.hidden, stream.gate, stream.cond))
            row += n
        return outs[0], outs[1], filled
