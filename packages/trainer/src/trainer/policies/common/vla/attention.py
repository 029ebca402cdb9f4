"""Attention as LeRobot's VLA policies compute it: block masks over [prefix; suffix] and eager
grouped-query attention in float32."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trainer.policies.common.checkpointing import checkpointed


def block_mask(pad: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """(B, L, L) attention mask: token i sees token j when j is not padding and j's block (the
    cumulative sum of `blocks`) is not after i's."""
    cumulative = torch.cumsum(blocks, dim=1)
    return (cumulative[:, None, :] <= cumulative[:, :, None]) & (pad[:, None, :] & pad[:, :, None])


def attend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor,
    heads: int,
    recompute: bool = False,
) -> torch.Tensor:
    """Eager grouped-query attention: query (B, Lq, H, D), key/value (B, Lk, KV, D), mask (B, Lq, Lk)
    True = attend; scores in float32 scaled by D**-0.5, masked with float32's minimum. For a query
    that sees something this equals LeRobot's additive -2.38e38 mask; a query that sees nothing
    (padding) gets a uniform softmax either way, never NaN.

    The scores stay in float32 under autocast too (`--accelerator.mixed_precision=bf16`): autocast
    would compute them in bfloat16, where float32's minimum rounds to -inf, and a padding query's row
    of -inf is NaN after the softmax, which its values then carry into every later layer's keys.

    `recompute`: keep only the inputs for the backward pass and compute the rest again there, with the
    same values and so the same gradients. Autograd otherwise keeps the float32 scores, probabilities,
    queries and keys, four times the inputs; worth it where few queries attend to many keys (an
    action expert's to the prefix: cheap to recompute, and most of what its layer keeps)."""
    return (_attention_recomputed if recompute else _attention)(query, key, value, mask, heads)


def _attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, heads: int
) -> torch.Tensor:
    b, n, _, d = query.shape
    kv = key.shape[2]
    # each key/value head's query heads as one longer sequence: the keys and values are never repeated
    # per query head (autograd keeps what the matmuls read: repeated, they took `heads / kv` times the memory)
    query = query.reshape(b, n, kv, heads // kv, d).permute(0, 2, 3, 1, 4).reshape(b, kv, -1, d)
    key, value = key.transpose(1, 2), value.transpose(1, 2)
    with torch.autocast(query.device.type, enabled=False):
        scores = torch.matmul(query.float(), key.float().transpose(2, 3)) * d**-0.5
        scores = scores.view(b, kv, heads // kv, n, -1)
        scores = torch.where(mask[:, None, None], scores, torch.finfo(torch.float32).min)
        probs = F.softmax(scores, dim=-1)
    out = torch.matmul(probs.to(value.dtype).view(b, kv, -1, probs.shape[-1]), value)
    return out.view(b, heads, n, d).transpose(1, 2).reshape(b, n, heads * d)


_attention_recomputed = checkpointed(_attention)
