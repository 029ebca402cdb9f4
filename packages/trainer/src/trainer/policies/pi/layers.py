"""A decoder layer of PaliGemma's Gemma or of the action expert (LeRobot's `pi_gemma` module and
`compute_layer_complete`), each an FSDP unit whose forward() runs it.

The prefix (cameras and task) attends to itself only, the suffix (state and action tokens) to the prefix
and itself: LeRobot runs one attention over [prefix; suffix] with the prefix's view of the suffix masked
out, reading the layers' weights without calling their forward(), which FSDP's hooks never see. Here
the prefix runs through all of PaliGemma's layers first (each gives its keys and values), then the
suffix through the expert's layers, each attending to its layer's prefix keys and values and its own.
The numbers are the same; what changes is what FSDP2 gathers: a layer is gathered when its forward
runs and, in the backward pass, only when something it computed needs a gradient. With PaliGemma frozen
(`train_expert_only`, LoRA on LeRobot's targets) no prefix output does, so the backward gathers the
expert's small layers alone, never PaliGemma's (gathered as a pair, each layer of the 2 B model came
back with its expert layer).

The norms are LeRobot's `PiGemmaRMSNorm`: `x * rsqrt(mean(x^2) + eps) * (1 + w)` with the variance in
float32, or with a condition (pi0.5's action expert, adaRMS) `* (1 + scale) + shift` and a `gate` on
the residual, all three from `dense(cond)`. RoPE is transformers' Gemma rotary embedding (rotate-half,
cos/sin from `GemmaRotaryEmbedding`), attention eager in float32 (policies/common/vla/attention.py).
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from trainer.policies.common.vla.attention import attend

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


class MLPProjection(nn.Linear):
    """One of a Gemma MLP's three projections (gate, up, down), an FSDP unit of its own. FSDP2 holds a
    unit's gathered weights twice while it gathers them (the all-gather's buffer, then the weights
    copied out of it), so the largest unit sets what a step adds to the peak when little else is held,
    as with a frozen PaliGemma (LoRA, train_expert_only): gathered alone, a projection of gemma_2b's MLP
    (2048 x 16384, 67 MB in bfloat16) adds a third of what its whole MLP did. The idle last PaliGemma
    layer's MLP never runs, so its projections are never gathered (saved in pieces, as any unit)."""


class DecoderLayer(nn.Module):
    """A Gemma decoder layer under LeRobot's names (`self_attn.{q,k,v,o}_proj`, `mlp`, two norms),
    built from transformers' GemmaAttention and GemmaMLP. `idle`: nothing reads this layer's output
    (PaliGemma's last layer: pi0 reads the expert's output only), so it gives its keys and values alone
    and its queries, o_proj, second norm and MLP are kept but never run."""

    def __init__(self, gemma_config: Any, index: int, cond_dim: int | None, idle: bool = False) -> None:
        super().__init__()
        from transformers.models.gemma import modeling_gemma

        self.self_attn = modeling_gemma.GemmaAttention(gemma_config, index)
        self.mlp = modeling_gemma.GemmaMLP(gemma_config)
        for name in ("gate_proj", "up_proj", "down_proj"):
            linear = cast(nn.Linear, self.mlp.get_submodule(name))
            setattr(self.mlp, name, MLPProjection(linear.in_features, linear.out_features, bias=False))
        width, eps = gemma_config.hidden_size, gemma_config.rms_norm_eps
        self.input_layernorm = PiRMSNorm(width, eps, cond_dim)
        self.post_attention_layernorm = (IdleRMSNorm if idle else PiRMSNorm)(width, eps, cond_dim)
        self.heads: int = gemma_config.num_attention_heads
        self.idle = idle

    def forward(
        self,
        hidden: torch.Tensor,
        mask: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cond: torch.Tensor | None = None,
        past: KeyValue | None = None,
    ) -> tuple[torch.Tensor | None, KeyValue]:
        """(this stream's output, None for an idle layer; its own keys and values). Its queries attend
        to `past` (the expert's: the prefix's keys and values at this layer) and to its own keys;
        `mask` (B, L, past + L) and `cos`/`sin` (B, L, head_dim) cover this stream's L tokens."""
        query, key, value, gate = self._project(hidden, cond)
        key = rotate(key, cos, sin)
        # the values leave the unit as a tensor of their own (a `view` of v_proj's output otherwise)
        own = (key, value.clone())
        if query is None:
            return None, own
        if past is not None:
            key, value = torch.cat([past[0], key], dim=1), torch.cat([past[1], value], dim=1)
        # the expert's few queries over the whole prefix: its float32 scores recomputed in the backward
        # pass rather than kept (4.6 of the 11 MB an expert layer keeps at pi0.5's size, batch 2)
        attended = attend(rotate(query, cos, sin), key, value, mask, self.heads, recompute=past is not None)
        return self._finish(attended, hidden, gate, cond), own

    def _project(
        self, hidden: torch.Tensor, cond: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(queries or None when idle, keys, values), each (B, L, heads, head_dim) before RoPE, and the gate."""
        attn = self.self_attn
        h, gate = self.input_layernorm(hidden, cond)
        h = h.to(attn.q_proj.weight.dtype)
        shape = (*h.shape[:-1], -1, attn.head_dim)
        q = None if self.idle else attn.q_proj(h).view(shape)
        return q, attn.k_proj(h).view(shape), attn.v_proj(h).view(shape), gate

    def _finish(
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


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE of x (B, L, H, D) with cos/sin (B, L, D) as transformers' Gemma applies it."""
    from transformers.models.gemma.modeling_gemma import rotate_half

    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    return x * cos + rotate_half(x) * sin


class JointLayer(nn.Module):
    """Layer i of PaliGemma's Gemma (`paligemma`) and of the action expert (`expert`), the pair whose
    streams attend together: a container that names them `layers.{i}.paligemma` / `.expert` (weights.py
    maps LeRobot's two stacks to it); each layer is its own FSDP unit and runs its own forward()."""

    def __init__(self, vlm_config: Any, expert_config: Any, index: int, last: bool, adarms: bool) -> None:
        super().__init__()
        self.paligemma = DecoderLayer(vlm_config, index, None, idle=last)
        self.expert = DecoderLayer(expert_config, index, expert_config.hidden_size if adarms else None)
