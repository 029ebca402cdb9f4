"""Does a DCP chunk table describe every element and every record byte exactly once?

A DCP tensor is saved as chunks, boxes of offsets and sizes. A reader assembling the tensor must know
that the boxes tile it: a gap leaves uninitialized memory in the output, an overlap means two chunks
claim the same elements. `ckpt verify` lists every such problem and `ckpt convert` refuses on the first,
so both run these checks, in O(n log n) for n chunks however they are arranged:

- dimensions that every chunk spans whole are set aside; when at most one dimension is left (FSDP and
  HSDP split dim 0), sorting the chunks by start shows every overlap between neighbours;
- with more, the corner test decides: boxes inside the tensor tile it exactly when their element counts
  add up to its own and every corner point occurs an even number of times among all the boxes' corners,
  except the tensor's own corners, which occur an odd number of times. (Modulo 2 the corners determine
  how many boxes cover each element, so every element is covered an odd number of times, hence at least
  once, and the count adds up only when it is once.) Overlapping pairs are then searched only to name
  them, within a fixed number of comparisons.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import product

from ckpt_tools.dcp.index import ChunkEntry, DcpIndex, TensorEntry, read_dcp_index
from ckpt_tools.errors import CorruptCheckpointError

MAX_SPLIT_DIMS = 12
"""Dimensions split across chunks that the corner test handles (2**12 corners a chunk); real
checkpoints split one or two."""
MAX_LISTED = 20
"""Problems listed per tensor or file; the rest are counted."""
_PAIR_BUDGET = 200_000


def read_tiled_index(path: str) -> DcpIndex:
    """`read_dcp_index`, refusing (on the first problem) a tensor whose chunks do not tile it: what a
    reader that assembles tensors needs before it allocates or writes anything."""
    index = read_dcp_index(path)
    for entry in index.tensors.values():
        check_tiling(entry, index.path)
    return index


def check_tiling(entry: TensorEntry, where: str) -> None:
    """Raise CorruptCheckpointError on the first coverage problem of one tensor."""
    problems = chunk_coverage_problems(entry, where)
    if problems:
        raise CorruptCheckpointError(f"{problems[0]}; run ckpt verify to list every problem")


def dcp_index_problems(index: DcpIndex) -> list[str]:
    """Every chunk-table problem of a DCP directory: coverage, bounds, and records sharing bytes."""
    problems: list[str] = []
    for entry in index.tensors.values():
        problems += chunk_coverage_problems(entry, index.path)
    problems += _record_overlap_problems(index)
    return problems


def chunk_coverage_problems(entry: TensorEntry, where: str) -> list[str]:
    """The chunks of a tensor must lie inside its shape and tile it exactly once."""
    label = f"{where}: tensor {entry.name!r} {list(entry.shape)}"
    outside = [chunk for chunk in entry.chunks if not _chunk_inside(chunk, entry.shape)]
    problems = [
        f"{label}: chunk at offsets {list(chunk.offsets)} sizes {list(chunk.sizes)} lies outside the tensor"
        for chunk in outside[:MAX_LISTED]
    ]
    problems += _more(len(outside), "chunks lie outside the tensor")
    inside = [chunk for chunk in entry.chunks if chunk.numel and _chunk_inside(chunk, entry.shape)]
    split = [d for d in range(len(entry.shape)) if any(_splits(chunk, entry.shape, d) for chunk in inside)]
    total = _volume(entry.shape)
    covered = sum(chunk.numel for chunk in inside)
    if len(split) > MAX_SPLIT_DIMS:
        return [
            *problems,
            f"{label}: chunks split {len(split)} dimensions; at most {MAX_SPLIT_DIMS} are checked",
        ]
    if len(split) <= 1:  # the sweep finds every overlap
        pairs = _overlapping_pairs(inside, split)
        exact = covered == total and not pairs
    else:
        exact = covered == total and _corners_match(inside, split, entry.shape)
        pairs = [] if exact else _overlapping_pairs(inside, split)
    problems += [
        f"{label}: chunks at offsets {list(a.offsets)} and {list(b.offsets)} overlap"
        for a, b in pairs[:MAX_LISTED]
    ]
    problems += _more(len(pairs), "overlapping pairs")
    if not exact and covered > total and not pairs:
        problems.append(f"{label}: chunks overlap (they hold {covered} of {total} elements)")
    if not exact and covered <= total:
        problems.append(
            f"{label}: chunks leave a gap (they hold {covered} of {total} elements, counting overlaps)"
        )
    return problems


def _more(count: int, what: str) -> list[str]:
    return [f"... and {count - MAX_LISTED} more {what}"] if count > MAX_LISTED else []


def _volume(sizes: Iterable[int]) -> int:
    count = 1
    for size in sizes:
        count *= size
    return count


def _chunk_inside(chunk: ChunkEntry, shape: tuple[int, ...]) -> bool:
    if len(chunk.offsets) != len(shape) or len(chunk.sizes) != len(shape):
        return False
    return all(o + s <= d for o, s, d in zip(chunk.offsets, chunk.sizes, shape, strict=True))


def _splits(chunk: ChunkEntry, shape: tuple[int, ...], dim: int) -> bool:
    return chunk.offsets[dim] != 0 or chunk.sizes[dim] != shape[dim]


def _corners_match(chunks: list[ChunkEntry], split: list[int], shape: tuple[int, ...]) -> bool:
    """Every corner (over the split dimensions) occurs an even number of times, except the tensor's."""
    odd: set[tuple[int, ...]] = set()
    for chunk in chunks:
        ends = [(chunk.offsets[d], chunk.offsets[d] + chunk.sizes[d]) for d in split]
        odd.symmetric_difference_update(product(*ends))
    return odd == set(product(*[(0, shape[d]) for d in split]))


def _overlapping_pairs(chunks: list[ChunkEntry], split: list[int]) -> list[tuple[ChunkEntry, ChunkEntry]]:
    """Overlapping pairs, by a sweep along the first split dimension: with one split dimension each
    chunk is compared with the one reaching furthest before it; with more, with the chunks still open
    there, until a fixed budget of comparisons is spent."""
    if not split:  # every chunk is the whole tensor
        return [(chunks[0], other) for other in chunks[1:]]
    first = split[0]
    boxes = sorted(chunks, key=lambda c: (c.offsets[first], c.sizes[first]))
    pairs: list[tuple[ChunkEntry, ChunkEntry]] = []
    if len(split) == 1:
        holder = boxes[0]
        for box in boxes[1:]:
            if box.offsets[first] < _end(holder, first):
                pairs.append((holder, box))
            if _end(box, first) > _end(holder, first):
                holder = box
        return pairs
    budget = _PAIR_BUDGET
    open_boxes: list[ChunkEntry] = []
    for box in boxes:
        open_boxes = [a for a in open_boxes if _end(a, first) > box.offsets[first]]
        for other in open_boxes:
            budget -= 1
            if budget < 0:
                return pairs
            if all(_intersect(other, box, d) for d in split):
                pairs.append((other, box))
        open_boxes.append(box)
    return pairs


def _end(chunk: ChunkEntry, dim: int) -> int:
    return chunk.offsets[dim] + chunk.sizes[dim]


def _intersect(a: ChunkEntry, b: ChunkEntry, dim: int) -> bool:
    return b.offsets[dim] < _end(a, dim) and a.offsets[dim] < _end(b, dim)


def _record_overlap_problems(index: DcpIndex) -> list[str]:
    """Two records in one `.distcp` file must not share bytes."""
    records: dict[str, list[tuple[int, int, str]]] = {}
    for entry in index.tensors.values():
        for chunk in entry.chunks:
            label = f"{entry.name!r} chunk {list(chunk.offsets)}"
            records.setdefault(chunk.file, []).append(
                (chunk.file_offset, chunk.file_offset + chunk.length, label)
            )
    for obj in index.objects.values():
        records.setdefault(obj.file, []).append(
            (obj.file_offset, obj.file_offset + obj.length, repr(obj.name))
        )
    problems = []
    for file, spans in sorted(records.items()):
        spans.sort()
        reach, holder = 0, ""
        found = []
        for begin, end, label in spans:
            if begin < reach:
                found.append(f"{index.path}/{file}: the records of {holder} and {label} overlap")
            if end > reach:
                reach, holder = end, label
        problems += found[:MAX_LISTED] + _more(len(found), f"overlapping records in {file}")
    return problems
