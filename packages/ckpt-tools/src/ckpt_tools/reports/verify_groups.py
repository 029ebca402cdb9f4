"""`ckpt verify`'s checks of the tensors themselves, from headers and `.metadata` alone: every
safetensors header (byte ranges inside the file), a sharded index against its shards, every DCP chunk
table (chunks tile each tensor, records lie inside their `.distcp` files without sharing bytes, each
missing or short file named), and the agreement of names, shapes and dtypes between two formats of one
role and between the EMA and the weights it averages.

Each finding is keyed by the file it is about (a shard, a `.distcp` file, `.metadata`), so the
manifest's check, which runs later, does not name that file again.
"""

from __future__ import annotations

from collections.abc import Mapping

from ckpt_tools.catalog import ADAPTER, DCP, EMA, MODEL, OPTIMIZER, SHARDED_SAFETENSORS, WeightSet
from ckpt_tools.dcp.chunk_tiling import dcp_index_problems
from ckpt_tools.dcp.index import DcpIndex, dcp_file_problems, read_dcp_index
from ckpt_tools.dcp.records import dcp_record_problems
from ckpt_tools.files.safetensors_io import SafetensorsHeader, read_safetensors_header
from ckpt_tools.files.sharded_safetensors import read_weight_map
from ckpt_tools.format import layout
from ckpt_tools.reports.describe import (
    TensorGroup,
    dcp_group_from_index,
    read_group,
    sharded_group_from_headers,
)
from ckpt_tools.reports.findings import Findings


def verify_groups(
    findings: Findings, locations: list[WeightSet], *, records: bool = False
) -> list[TensorGroup]:
    """The tensor group of every weight set that reads; `records` also checks DCP records' CRC-32."""
    groups = []
    indexes: dict[str, DcpIndex | None] = {}  # a DCP directory may hold two roles (torchtitan's)
    for location in locations:
        if location.format == DCP:
            group = _dcp_group(findings, location, indexes, records)
        elif location.format == SHARDED_SAFETENSORS:
            group = _sharded_group(findings, location)
        else:
            group = findings.run(f"{location.path}: headers", read_group, location, about=location.path)
        if group is not None:
            groups.append(group)
    return groups


def _dcp_group(
    findings: Findings, location: WeightSet, indexes: dict[str, DcpIndex | None], records: bool
) -> TensorGroup | None:
    """A DCP directory's chunk table, checked once however many roles it holds, and one role's group."""
    if location.path not in indexes:
        indexes[location.path] = _verify_index(findings, location.path, records)
    index = indexes[location.path]
    if index is None:
        return None
    what = f"{location.path}: {location.role} keys"
    return findings.run(what, dcp_group_from_index, location.role, index, about=location.path)


def _verify_index(findings: Findings, path: str, records: bool) -> DcpIndex | None:
    metadata = layout.join(path, layout.DCP_METADATA)
    index = findings.run(f"{path}: .metadata", _read_index_only, path, about=metadata)
    if index is not None:
        findings.extend(f"{path}: files", dcp_file_problems(index))
        findings.extend_about(f"{path}: chunks", path, dcp_index_problems(index))
        if records:
            findings.extend(f"{path}: chunk records (CRC-32)", dcp_record_problems(index))
    return index


def _read_index_only(path: str) -> DcpIndex:
    """The chunk table without the file checks, which `dcp_file_problems` lists one by one."""
    return read_dcp_index(path, check_files=False)


def _sharded_group(findings: Findings, location: WeightSet) -> TensorGroup | None:
    """The shards of an index, each header read once (a damaged shard is one finding, keyed by the
    shard), then each tensor of the index found in the shard it names and each shard tensor indexed."""
    index_path = location.path
    weight_map = findings.run(None, read_weight_map, index_path, about=index_path)
    if weight_map is None:
        return None
    shards = sorted(set(weight_map.values()))
    headers = {}
    for shard in shards:
        path = layout.join(layout.parent(index_path), shard)
        header = findings.run(None, read_safetensors_header, path, about=path)
        if header is not None:
            headers[shard] = header
    mismatches = _weight_map_mismatches(index_path, weight_map, headers)
    if len(headers) < len(shards):
        findings.extend_about(None, index_path, mismatches)
        return None
    findings.checked.append(f"{index_path}: headers")
    findings.extend_about(f"{index_path}: weight map", index_path, mismatches)
    return sharded_group_from_headers(location.role, index_path, headers.values())


def _weight_map_mismatches(
    index_path: str, weight_map: Mapping[str, str], headers: Mapping[str, SafetensorsHeader]
) -> list[str]:
    """Tensors the index places in a shard that lacks them, and shard tensors it does not list."""
    problems = []
    for shard, header in sorted(headers.items()):
        listed = {name for name, file in weight_map.items() if file == shard}
        problems += [
            f"{index_path}: {name!r} is not in {shard}" for name in sorted(listed - set(header.tensors))
        ]
        problems += [
            f"{index_path}: {shard} holds {name!r}, which the index does not list"
            for name in sorted(set(header.tensors) - listed)
        ]
    return problems


def compare_formats(findings: Findings, groups: list[TensorGroup]) -> None:
    """Two groups of the same role (model safetensors and model DCP) must hold the same tensors."""
    by_role: dict[str, list[TensorGroup]] = {}
    for group in groups:
        by_role.setdefault(group.role, []).append(group)
    for role, same in by_role.items():
        if role == OPTIMIZER:
            continue  # safetensors and DCP optimizer state use different key schemes
        for other in same[1:]:
            what = f"{same[0].label} and {other.label} agree"
            findings.extend_about(what, None, _group_differences(same[0], other))
    weights = by_role.get(ADAPTER) or by_role.get(MODEL) or []
    for ema in by_role.get(EMA, []) if weights else []:
        what = f"{ema.label} averages {weights[0].label}"
        findings.extend_about(what, None, _ema_differences(ema, weights[0]))


def _ema_differences(ema: TensorGroup, weights: TensorGroup) -> list[str]:
    """The EMA averages some of the weights (the trained parameters): each of its tensors MUST be one of
    theirs, with the same shape and dtype, or loading it in their place would not fit the model."""
    theirs = {t.name: t for t in weights.tensors}
    problems = []
    for tensor in ema.tensors:
        mine = theirs.get(tensor.name)
        if mine is None:
            problems.append(f"{tensor.name!r} is in {ema.label} but not in {weights.label}")
        elif (mine.shape, mine.dtype) != (tensor.shape, tensor.dtype):
            problems.append(
                f"{tensor.name!r} is {tensor.dtype}{list(tensor.shape)} in {ema.label} but "
                f"{mine.dtype}{list(mine.shape)} in {weights.label}"
            )
    return problems


def _group_differences(a: TensorGroup, b: TensorGroup) -> list[str]:
    left = {t.name: t for t in a.tensors}
    right = {t.name: t for t in b.tensors}
    problems = [
        f"{name!r} is in {a.label} but not in {b.label}" for name in sorted(left.keys() - right.keys())
    ]
    problems += [
        f"{name!r} is in {b.label} but not in {a.label}" for name in sorted(right.keys() - left.keys())
    ]
    for name in sorted(left.keys() & right.keys()):
        x, y = left[name], right[name]
        if (x.shape, x.dtype) != (y.shape, y.dtype):
            problems.append(
                f"{name!r} is {x.dtype}{list(x.shape)} in {a.label} but {y.dtype}{list(y.shape)} in {b.label}"
            )
    return problems
