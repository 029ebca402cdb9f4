"""A token embedding looked up on the rows each rank holds, so that no rank gathers the table.

FSDP2 shards every parameter by rows (dim 0) and gathers a unit's parameters whole before its forward
runs: for a token embedding, the whole vocabulary at every lookup (pi0's PaliGemma: 257,152 x 2048,
1.05 GB in bfloat16) to read a few hundred rows. `lookup` reads an embedding that is an FSDP unit of
its own without running its forward, so FSDP never gathers it:

- forward: the ranks of the shard group exchange their token ids (each rank's batch is its own), each
  looks up the ids that fall in its rows (zeros for the others), and a reduce-scatter sums the partial
  embeddings and hands each rank its own tokens' rows. One rank contributes each value and the others
  add zeros, so the result is the plain lookup's, bit for bit;
- backward: the output gradients are all-gathered over the same group and each rank adds those of the
  tokens in its rows into its shard's gradient (none for `padding_idx`, as `nn.Embedding`), which is
  then reduced as FSDP2 reduces a unit's gradients: averaged over the data-parallel ranks (summed over
  HSDP's replicas first), in its `MixedPrecisionPolicy`'s dtypes, onto the shard's gradient.

The unit's forward never runs, so no FSDP hook of it fires; the gradient reaches the sharded parameter
through `DTensor.to_local()`. A module that is not sharded on its own (one process, DDP, or an
embedding inside another unit, which FSDP gathered already) is looked up by its own forward: `embed`
chooses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset  # not re-exported


@dataclass(frozen=True)
class RowShards:
    """Where an embedding's rows are: this rank's `[start, start + rows)`, the group sharing the table
    (its shard dim of the mesh) and the replicas' groups (HSDP), the data-parallel degree FSDP2
    averages gradients over, and the dtypes of its unit's mixed precision policy."""

    start: int
    rows: int
    shard_group: dist.ProcessGroup
    replica_groups: tuple[dist.ProcessGroup, ...]
    degree: int
    compute_dtype: torch.dtype
    reduce_dtype: torch.dtype
    output_dtype: torch.dtype | None


def is_row_sharded(embedding: nn.Embedding) -> bool:
    """Whether `embedding` is an FSDP unit of its own, sharded by rows, outside its forward (its weight a
    DTensor): `lookup` then reads it on the local rows."""
    weight = embedding.weight
    return (
        isinstance(embedding, FSDPModule) and isinstance(weight, DTensor) and _shard_dim(weight) is not None
    )


def embed(embedding: nn.Embedding, tokens: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """`embedding(tokens)`: its forward, or when it is row-sharded (`is_row_sharded`) the lookup on each
    rank's rows, times `scale` (what a subclass's forward multiplies by: Gemma's sqrt(width))."""
    if is_row_sharded(embedding):
        return lookup(embedding, tokens, scale)
    return cast(torch.Tensor, embedding(tokens))


def lookup(embedding: nn.Embedding, tokens: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """`nn.Embedding`'s rows for `tokens`, times `scale` (a subclass's forward: Gemma's sqrt(width)),
    read on the local rows of a row-sharded embedding (`is_row_sharded`), in the dtypes its unit's
    forward would give. Collective over its shard group: every rank of it looks up once, in order."""
    weight = embedding.weight
    assert isinstance(weight, DTensor) and isinstance(embedding, FSDPModule), "not row-sharded"
    shards = _row_shards(embedding, weight)
    # An FSDP2 unit whose forward never runs has no gathered gradient for FSDP to hold back during
    # gradient accumulation (accelerate's no_sync): its gradient is reduced here, at every backward.
    embedding.set_requires_gradient_sync(True, recurse=False)
    rows = _Lookup.apply(weight.to_local(), tokens, shards, embedding.padding_idx)
    if scale is not None:
        rows = rows * scale.to(rows.dtype)
    return rows if shards.output_dtype is None else rows.to(shards.output_dtype)


class _Lookup(torch.autograd.Function):
    """The lookup and its gradient on the local rows (the module docstring); `ctx.padded` is the token
    count every rank pads its own to for the collectives."""

    @staticmethod
    def forward(
        ctx: Any, local: torch.Tensor, tokens: torch.Tensor, shards: RowShards, padding_idx: int | None
    ) -> torch.Tensor:
        group, count, width = shards.shard_group, tokens.numel(), local.shape[1]
        padded = int(_all_gather(torch.tensor([count], device=tokens.device), group).max())
        ids = _all_gather(F.pad(tokens.reshape(-1), (0, padded - count)), group)  # (ranks, padded)
        inside = (ids >= shards.start) & (ids < shards.start + shards.rows)
        rows = (ids - shards.start).clamp(0, max(shards.rows - 1, 0))
        partial = torch.zeros(*ids.shape, width, dtype=shards.compute_dtype, device=tokens.device)
        if shards.rows:
            found = F.embedding(rows.to(local.device), local).to(partial)
            partial = torch.where(inside[..., None], found, partial)
        mine = torch.empty(padded, width, dtype=partial.dtype, device=partial.device)
        dist.reduce_scatter(mine, list(partial), group=group)
        ctx.shards, ctx.padded, ctx.local = shards, padded, (local.shape, local.dtype, local.device)
        learned = inside if padding_idx is None else inside & (ids != padding_idx)
        ctx.save_for_backward(rows, learned)
        return mine[:count].reshape(*tokens.shape, width)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        shards: RowShards = ctx.shards
        (shape, dtype, device), (rows, learned) = ctx.local, ctx.saved_tensors
        mine = grad.reshape(-1, grad.shape[-1]).to(shards.compute_dtype)
        every = _all_gather(F.pad(mine, (0, 0, 0, ctx.padded - len(mine))), shards.shard_group)
        local = torch.zeros(shape, dtype=shards.reduce_dtype, device=device)
        if shards.rows:
            local.index_add_(0, rows[learned].to(device), every[learned].to(device, shards.reduce_dtype))
        for replicas in shards.replica_groups:
            dist.all_reduce(local, group=replicas)
        return local.div_(shards.degree).to(dtype), None, None, None


def _all_gather(tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Every rank's `tensor` (the same shape on each) stacked in group order."""
    out = torch.empty(dist.get_world_size(group), *tensor.shape, dtype=tensor.dtype, device=tensor.device)
    dist.all_gather(list(out), tensor, group=group)
    return out


def _shard_dim(weight: DTensor) -> int | None:
    """The mesh dim `weight`'s rows are split over when it is sharded by rows on one dim and replicated
    on the others (FSDP2's `Shard(0)`, HSDP's `(Replicate(), Shard(0))`); None otherwise."""
    dims = [i for i, p in enumerate(weight.placements) if type(p) is Shard and p.dim == 0]
    others = [p for i, p in enumerate(weight.placements) if i not in dims]
    return dims[0] if len(dims) == 1 and all(isinstance(p, Replicate) for p in others) else None


def _row_shards(unit: FSDPModule, weight: DTensor) -> RowShards:
    """This rank's rows of `weight` (DTensor's `Shard(0)`: torch.chunk's split), its groups, and
    its unit's mixed precision policy (FSDP2 keeps it in the unit's state, which has no public getter)."""
    shard_dim = _shard_dim(weight)
    assert shard_dim is not None
    mesh = weight.device_mesh
    shape, offset = compute_local_shape_and_global_offset(weight.shape, mesh, weight.placements)
    policy = unit._get_fsdp_state()._mp_policy
    compute = policy.param_dtype or weight.dtype
    return RowShards(
        start=offset[0],
        rows=shape[0],
        shard_group=mesh.get_group(shard_dim),
        replica_groups=tuple(mesh.get_group(d) for d in range(mesh.ndim) if d != shard_dim),
        degree=mesh.size(),
        compute_dtype=compute,
        reduce_dtype=policy.reduce_dtype or compute,
        output_dtype=policy.output_dtype,
    )
