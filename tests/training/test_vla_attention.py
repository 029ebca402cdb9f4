"""The VLA policies' eager attention (policies/common/vla/attention.py): with `recompute` it keeps only its
inputs for the backward pass and recomputes its float32 scores there, with the plain computation's
gradients bit for bit; pi's action expert attends to the prefix that way."""

from __future__ import annotations

import torch

from trainer.policies.common.vla.attention import attend
from trainer.policies.pi.backbone import gemma_config
from trainer.policies.pi.config import GemmaSize
from trainer.policies.pi.layers import DecoderLayer

# pi0.5's action expert attending to a 456-token prefix: 50 queries, 8 query heads on 1 key/value head
B, LQ, LK, HEADS, KV, D = 2, 50, 506, 8, 1, 256


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    query, key, value = (
        torch.randn(B, length, heads, D, generator=generator, dtype=torch.bfloat16).requires_grad_()
        for length, heads in ((LQ, HEADS), (LK, KV), (LK, KV))
    )
    mask = torch.rand(B, LQ, LK, generator=generator) < 0.8
    return query, key, value, mask


def _kept_for_backward(function, *args, **kwargs) -> list[torch.Tensor]:
    """The distinct tensors autograd keeps while `function(*args, **kwargs)` computes."""
    kept: dict[int, torch.Tensor] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        kept[tensor.untyped_storage().data_ptr()] = tensor
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        function(*args, **kwargs)
    return list(kept.values())


def test_recomputed_attention_keeps_only_its_inputs_for_the_backward_pass() -> None:
    query, key, value, mask = _inputs()
    inputs = sum(t.numel() * t.element_size() for t in (query, key, value, mask))
    sizes = {}
    for recompute in (False, True):
        kept = _kept_for_backward(attend, query, key, value, mask, HEADS, recompute=recompute)
        sizes[recompute] = sum(t.untyped_storage().nbytes() for t in kept)
    assert 0 < sizes[True] <= inputs < sizes[False] / 3, sizes  # float32 scores otherwise


def test_recomputed_attention_has_the_plain_computations_gradients() -> None:
    results = []
    for recompute in (False, True):
        query, key, value, mask = _inputs()
        out = attend(query, key, value, mask, HEADS, recompute=recompute)
        out.float().square().sum().backward()
        results.append((out.detach(), query.grad, key.grad, value.grad))
    for plain, recomputed in zip(*results, strict=True):
        assert plain is not None and recomputed is not None and torch.equal(plain, recomputed)


def test_pi_experts_attention_to_the_prefix_keeps_no_scores() -> None:
    """An expert layer (its queries attend to the prefix's keys and values at that layer) keeps nothing
    of the scores' size; the prefix's own layer does keep them (its attention is not recomputed)."""
    size = GemmaSize(width=64, depth=1, mlp_dim=128, num_heads=HEADS, num_kv_heads=KV, head_dim=16)
    layer = DecoderLayer(gemma_config(size, vocab_size=32), index=0, cond_dim=None)
    prefix, suffix = 40, 10
    generator = torch.Generator().manual_seed(0)
    past = tuple(torch.randn(B, prefix, KV, 16, generator=generator) for _ in range(2))
    cos, sin = torch.ones(B, suffix, 16), torch.zeros(B, suffix, 16)
    hidden = torch.randn(B, suffix, 64, generator=generator, requires_grad=True)
    scores = B * HEADS * suffix * (prefix + suffix)
    mask = torch.ones(B, suffix, prefix + suffix, dtype=torch.bool)
    weights = {p.untyped_storage().data_ptr() for p in layer.parameters()}

    def activations(*args, **kwargs) -> list[int]:
        kept = _kept_for_backward(layer, *args, **kwargs)
        return sorted(t.numel() for t in kept if t.untyped_storage().data_ptr() not in weights)

    kept = activations(hidden, mask, cos, sin, past=past)
    assert kept and max(kept) < scores, kept
    own_mask = torch.ones(B, suffix, suffix, dtype=torch.bool)
    assert B * HEADS * suffix * suffix in activations(hidden, own_mask, cos, sin)
