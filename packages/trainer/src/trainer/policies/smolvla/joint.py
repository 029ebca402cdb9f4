"""The VLM's text layers and the action expert's layers run side by side, as SmolVLA runs them.

Layer i of both stacks runs together: in a self-attention layer the prefix (cameras, task, state) and
the action tokens attend jointly, each stream through its own q/k/v/o projections; in a
cross-attention layer the VLM attends over the prefix alone and the expert's k/v projections read the
VLM's (post-RoPE) keys and values, its queries at positions restarting from 0. Attention is eager in
float32 with a boolean mask; RoPE is SmolVLA's own (base 10000, on halves of head_dim, the VLM
config's rope_theta unused). The decoder layers' forward() is never called: their norms, projections
and MLP are (which is why the FSDP units are those submodules: distributed/units.py notes).

Sampling computes the prefix's keys and values once (`KeyValues`) and reuses them at every Euler step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from trainer.policies.common.vla.attention import attend
from trainer.policies.smolvla.backbone import VLMWithExpert

ROPE_BASE = 10_000.0

# One (keys, values) pair per layer, (B, prefix, kv_heads, head_dim), post-RoPE.
KeyValues = list[tuple[torch.Tensor, torch.Tensor]]


def rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of `x` (B, L, H, D) at `positions` (B, L): rotate the two halves of D."""
    half = x.shape[-1] // 2
    dtype = x.dtype
    x = x.float()
    exponents = (2.0 / x.shape[-1]) * torch.arange(half, dtype=torch.float32, device=x.device)
    radians = positions[..., None].float() / (ROPE_BASE**exponents)[None, None, :]
    sin, cos = torch.sin(radians[..., None, :]), torch.cos(radians[..., None, :])
    x1, x2 = x.split(half, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(dtype)


def _qkv(layer: Any, hidden: torch.Tensor) -> tuple[torch.Tensor, ...]:
    attn = layer.self_attn
    h = layer.input_layernorm(hidden).to(attn.q_proj.weight.dtype)
    shape = (*h.shape[:-1], -1, attn.head_dim)
    return attn.q_proj(h).view(shape), attn.k_proj(h).view(shape), attn.v_proj(h).view(shape)


def _finish(layer: Any, attended: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """o_proj and residual, then the MLP and its residual."""
    out = layer.self_attn.o_proj(attended.to(layer.self_attn.o_proj.weight.dtype)) + hidden
    return layer.mlp(layer.post_attention_layernorm(out)) + out


@dataclass
class _Step:
    """What every layer of one pass reads: the (B, queries, keys) mask, the queries' positions, the
    prefix's cached keys/values (sampling), and the list the prefill fills (None otherwise)."""

    mask: torch.Tensor
    positions: torch.Tensor
    cache: KeyValues | None
    filled: KeyValues | None


class JointStack:
    """Runs the two stacks of a `VLMWithExpert` over [prefix, actions] (either may be None). The
    layers are transformers' LlamaDecoderLayers (typed Any: their attributes are untyped there)."""

    def __init__(self, model: VLMWithExpert) -> None:
        self.model = model
        self.vlm_layers = list(model.vlm.model.text_model.layers)

    def run(
        self,
        prefix: torch.Tensor | None,
        suffix: torch.Tensor | None,
        mask: torch.Tensor,
        positions: torch.Tensor,
        cache: KeyValues | None = None,
        fill: bool = False,
    ) -> tuple[torch.Tensor | None, KeyValues]:
        """The expert's normed output for the action tokens (None without them) and, with `fill`, the
        prefix's keys and values per layer. `cache` (sampling) holds the prefix's keys and values,
        the prefix then being None."""
        step = _Step(mask, positions, cache, [] if fill else None)
        streams = [prefix, suffix]
        for i, vlm_layer in enumerate(self.vlm_layers):
            layers = [vlm_layer, self.model.expert_layer(i)]
            joint = fill or self.model.is_self_attention(i)
            outs = (self._joint if joint else self._cross)(i, layers, streams, step)
            streams = [
                None if h is None else h if (layer is None or out is None) else _finish(layer, out, h)
                for layer, h, out in zip(layers, streams, outs, strict=True)
            ]
        out = streams[1]
        return (None if out is None else self.model.lm_expert.norm(out)), step.filled or []

    def _joint(
        self, i: int, layers: list[Any], streams: list[torch.Tensor | None], step: _Step
    ) -> list[torch.Tensor | None]:
        """Self-attention over the concatenated streams; each stream's slice of the result."""
        present = [
            (h, layer)
            for h, layer in zip(streams, layers, strict=True)
            if h is not None and layer is not None
        ]
        parts = [_qkv(layer, h) for h, layer in present]
        q, k, v = (torch.cat([p[j] for p in parts], dim=1) for j in range(3))
        length = q.shape[1]
        pos, m = (
            (step.positions, step.mask)
            if length >= step.positions.shape[1]
            else (step.positions[:, :length], step.mask[:, :length, :length])
        )
        q, k = rope(q, pos), rope(k, pos)
        if step.filled is not None:
            step.filled.append((k, v))
        if step.cache is not None:
            k, v = torch.cat([step.cache[i][0], k], dim=1), torch.cat([step.cache[i][1], v], dim=1)
        attended = attend(q, k, v, m, self.model.heads)
        outs: list[torch.Tensor | None] = []
        start = 0
        for h, layer in zip(streams, layers, strict=True):
            if h is None or layer is None:
                outs.append(None)
                continue
            outs.append(attended[:, start : start + h.shape[1]])
            start += h.shape[1]
        return outs

    def _cross(
        self, i: int, layers: list[Any], streams: list[torch.Tensor | None], step: _Step
    ) -> list[torch.Tensor | None]:
        """The VLM attends over the prefix; the expert's queries attend to the VLM's keys/values."""
        prefix, suffix = streams
        vlm_layer, expert = layers
        outs: list[torch.Tensor | None] = [None, None]
        mask, positions = step.mask, step.positions
        if prefix is not None and step.cache is None:
            n = prefix.shape[1]
            q, k, v = _qkv(vlm_layer, prefix)
            q, k = rope(q, positions[:, :n]), rope(k, positions[:, :n])
            outs[0] = attend(q, k, v, mask[:, :n, :n], self.model.heads)
            expert_positions = positions[:, n:]
        else:
            assert step.cache is not None
            k, v = step.cache[i]
            expert_positions = positions
        if expert is None or suffix is None:
            return outs
        attn = expert.self_attn
        h = expert.input_layernorm(suffix).to(attn.q_proj.weight.dtype)
        eq = attn.q_proj(h).view(*h.shape[:-1], -1, attn.head_dim)
        flat_k = k.reshape(*k.shape[:2], -1).to(attn.k_proj.weight.dtype)
        flat_v = v.reshape(*v.shape[:2], -1).to(attn.v_proj.weight.dtype)
        ek = attn.k_proj(flat_k).view(*flat_k.shape[:-1], -1, attn.head_dim)
        ev = attn.v_proj(flat_v).view(*flat_v.shape[:-1], -1, attn.head_dim)
        expert_positions = expert_positions - expert_positions.min(dim=1, keepdim=True).values
        eq = rope(eq, expert_positions)
        outs[1] = attend(eq, ek, ev, mask[:, -suffix.shape[1] :, : ek.shape[1]], self.model.heads)
        return outs
