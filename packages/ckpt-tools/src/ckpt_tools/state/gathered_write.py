"""A gathered safetensors file written tensor by tensor: no full copy of the model in any process.

`safetensors.torch.save` needs every tensor in memory at once and, to hash the file for the manifest,
serializes it into one bytes object first: a single process's save held its model twice, and a sharded
run's main rank gathered the whole model before writing. Here the header is built from names, dtypes
and shapes alone (`files/safetensors_writer.py`, the library's layout: widest dtype first, then by
name), then each tensor is written in file order: a plain tensor from its own memory (no copy), a
tensor sharded by rows (FSDP2's `Shard(0)`, HSDP's `(Replicate(), Shard(0))`) block by block in row
order, the main rank writing its own rows from their memory and receiving each other rank's in pieces
of at most `PIECE_BYTES` (point to point: the other ranks hold nothing more than their shards), any
other DTensor gathered (`full_tensor`, a collective every rank runs in the same order) and freed
before the next. The manifest's digest is taken from the bytes as they pass. The file has the bytes
`safetensors.torch.save` writes for the gathered state (tests/ckpt/test_gathered_write.py); peak
memory on any rank is its shard plus one piece (a tensor for a DTensor sharded otherwise).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate, Shard

from ckpt_tools.files.digest import Recorder
from ckpt_tools.files.manifest import write_json
from ckpt_tools.files.safetensors_writer import SafetensorsStreamWriter, TensorSpec
from ckpt_tools.files.sharded_safetensors import index_document, plan_shards
from ckpt_tools.format import layout
from ckpt_tools.state.collective import Group
from ckpt_tools.tensors.tensor_io import tensor_spec, write_tensor_bytes

METADATA = {"format": "pt"}  # what the gathered saves have always written
PIECE_BYTES = 16 * 2**20  # the most of another rank's rows the main rank holds at once while writing


def write_gathered_safetensors(
    path: str,
    state: Mapping[str, torch.Tensor],
    group: Group,
    recorder: Recorder | None,
    shard_size: int | None = None,
) -> None:
    """Collective when `state` holds DTensors: call on all ranks with the same names. The main rank
    writes `path`; its failure is kept in `group` for the next `agree` (the others still gather).

    `shard_size` (bytes): shards of at most that size beside `path` instead, named and split as
    huggingface_hub does (`files/sharded_safetensors.py`), and their index, recorded like every file;
    one file still when everything fits. Every rank plans the same files from shapes alone, so the
    gathers run in the same order everywhere."""
    stem = layout.name(path).removesuffix(".safetensors")
    shards = plan_shards([tensor_spec(name, value) for name, value in state.items()], shard_size, stem)
    model_dir = layout.parent(path)
    for file_name, specs in shards:
        _write_file(layout.join(model_dir, file_name), specs, state, group, recorder)
    if len(shards) > 1:
        index = layout.join(model_dir, f"{stem}.safetensors.index.json")
        group.on_main(write_json, index, index_document(shards), recorder)


def _write_file(
    path: str,
    specs: list[TensorSpec],
    state: Mapping[str, torch.Tensor],
    group: Group,
    recorder: Recorder | None,
) -> None:
    """One file, its tensors in `specs` order, written by the main rank: a row-sharded one block by
    block (`_write_rows`), another DTensor gathered and freed before the next, a plain one as it is."""
    writers: list[SafetensorsStreamWriter] = []
    group.on_main(lambda: writers.append(SafetensorsStreamWriter(path, specs, METADATA, recorder)))
    for spec in specs:
        value = state[spec.name]
        if isinstance(value, DTensor) and (blocks := _row_blocks(value, group)) is not None:
            _write_rows(writers, value, blocks, group)
            continue
        full = value.full_tensor() if isinstance(value, DTensor) else value
        group.on_main(_write, writers, full)
        del full  # a gathered tensor is freed before the next is gathered
    group.on_main(_finish, writers)


@dataclass(frozen=True)
class RowBlocks:
    """A DTensor split by rows over one mesh dim, as the main rank collects it: the ranks holding the
    blocks of the main rank's replica (`ranks[j]` holds block j, global ranks of `group`; a rank of
    another replica is not among them and sends nothing), which of them is the main rank, and each
    block's first row (`starts[j]`, the total last)."""

    group: dist.ProcessGroup
    ranks: tuple[int, ...]
    main: int
    starts: tuple[int, ...]


def _row_blocks(value: DTensor, group: Group) -> RowBlocks | None:
    """How `value` is split by rows (one mesh dim `Shard(0)`, the others `Replicate()`), or None for any
    other layout, or when the save's main rank is not on its mesh. Every rank answers the same."""
    placements = value.placements
    dims = [i for i, p in enumerate(placements) if type(p) is Shard and p.dim == 0]
    if len(dims) != 1 or any(not isinstance(p, Replicate) for i, p in enumerate(placements) if i != dims[0]):
        return None
    mesh, dim = value.device_mesh, dims[0]
    main_rank = dist.get_global_rank(group.pg, 0) if group.pg is not None else 0
    where = (mesh.mesh == main_rank).nonzero()
    if len(where) != 1:
        return None
    coordinates: list[int | slice] = [int(c) for c in where[0]]  # the main rank's
    coordinates[dim] = slice(None)  # along `dim`: its replica's blocks
    ranks = tuple(int(r) for r in mesh.mesh[tuple(coordinates)])
    rows, count = value.shape[0], len(ranks)
    per_block = -(-rows // count)  # torch.chunk's split, as DTensor's Shard(0) and FSDP2 make it
    starts = tuple(min(j * per_block, rows) for j in range(count + 1))
    return RowBlocks(mesh.get_group(dim), ranks, int(where[0][dim]), starts)


def _write_rows(
    writers: list[SafetensorsStreamWriter], value: DTensor, blocks: RowBlocks, group: Group
) -> None:
    """`value`'s rows in order: the main rank's own from their memory, each other block's received from
    its holder piece by piece (point to point: the holder sends, the main rank writes, nobody else
    takes part). A piece is received even after a failed write, so that no holder waits for ever."""
    local, me = value.to_local(), dist.get_rank()
    step = max(1, PIECE_BYTES // max(math.prod(value.shape[1:]) * local.element_size(), 1))  # same everywhere
    main = blocks.ranks[blocks.main]
    for holder, (start, stop) in zip(blocks.ranks, itertools.pairwise(blocks.starts), strict=True):
        if me not in (holder, main):
            continue
        for offset in range(0, stop - start, step):
            rows = min(step, stop - start - offset)
            if holder == main:
                group.on_main(_write, writers, local[offset : offset + rows])
            elif me == holder:
                dist.send(local[offset : offset + rows].contiguous(), main, group=blocks.group)
            else:
                piece = torch.empty((rows, *local.shape[1:]), dtype=local.dtype, device=local.device)
                dist.recv(piece, holder, group=blocks.group)
                group.on_main(_write, writers, piece)


def _write(writers: list[SafetensorsStreamWriter], tensor: torch.Tensor) -> None:
    try:
        write_tensor_bytes(writers[0], tensor)
    except BaseException:
        writers[0].discard()
        raise


def _finish(writers: list[SafetensorsStreamWriter]) -> None:
    try:
        writers[0].close()
    except BaseException:
        writers[0].discard()
        raise
    writers[0].commit()
