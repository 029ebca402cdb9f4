"""Hugging Face style sharded safetensors: `model-0000k-of-0000n.safetensors` plus
`model.safetensors.index.json` ({"metadata": {"total_size": N}, "weight_map": {tensor: file}}).

A large model's single `model.safetensors` is one file of tens of gigabytes: the Hub, transformers and
most copy tools handle shards of a few gigabytes better. The split is huggingface_hub's own rule
(`split_state_dict_into_shards_factory`: tensors in the order given, a new shard when the next one
would pass the limit, a tensor above the limit alone in its shard), fed sizes from names, dtypes and
shapes (`TensorSpec`) so it needs no tensor: every FSDP2 rank plans the same files, and so gathers its
tensors in the same order, and a DCP conversion plans before reading a byte. Inside a shard tensors are
in the safetensors library's order (`aligned_order`), so each shard holds the bytes
`huggingface_hub.save_torch_state_dict` writes for it. The readers (`shard_headers`) accept a set that
transformers or huggingface_hub wrote, whatever their split.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ckpt_tools.errors import CheckpointNotFoundError, CorruptCheckpointError, UsageError
from ckpt_tools.files import storage
from ckpt_tools.files.safetensors_io import SafetensorsHeader, read_safetensors_header
from ckpt_tools.files.safetensors_writer import TensorSpec, aligned_order
from ckpt_tools.format import layout

Shards = list[tuple[str, list[TensorSpec]]]  # (file name, its tensors in file order), in file order

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_UNITS |= {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(text: str | int, option: str = "--max-shard-size") -> int:
    """A size flag's value (a shard size; the trainer's `--dataset.cache_size`): `5GB` -> 5_000_000_000
    (decimal, as the Hub counts), `500MiB` -> 500 * 2**20, `1000` -> 1000 bytes. A malformed or
    non-positive value is a one-line `UsageError` naming `option`."""
    if isinstance(text, int):
        size = text
    else:
        match = _SIZE.match(text)
        if not match:
            raise UsageError(f"{option} {text!r} is not a size; use e.g. 5GB, 500MB or 2GiB", option=option)
        size = int(float(match.group(1)) * _UNITS[(match.group(2) or "B").upper()])
    if size <= 0:
        raise UsageError(f"{option} {text!r} must be positive", option=option)
    return size


def plan_shards(specs: Sequence[TensorSpec], max_size: int | None, stem: str = "model") -> Shards:
    """The files of `specs` (in state-dict order) at most `max_size` bytes each, by huggingface_hub's
    rule; one `<stem>.safetensors` when everything fits or `max_size` is None."""
    if max_size is None:
        return [(f"{stem}.safetensors", aligned_order(specs))]
    from huggingface_hub import split_state_dict_into_shards_factory  # torch-free, loaded when a save shards

    by_name = {spec.name: spec for spec in specs}
    split = split_state_dict_into_shards_factory(
        by_name,
        get_storage_size=lambda spec: spec.nbytes,
        filename_pattern=stem + "{suffix}.safetensors",
        max_shard_size=max_size,
    )
    return [
        (file_name, aligned_order([by_name[name] for name in names]))
        for file_name, names in split.filename_to_tensors.items()
    ]


def index_document(shards: Shards) -> dict[str, Any]:
    """The index transformers and huggingface_hub read: total bytes of tensor data, tensor -> file."""
    weight_map = {spec.name: file_name for file_name, specs in shards for spec in specs}
    total = sum(spec.nbytes for _, specs in shards for spec in specs)
    return {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}


def read_weight_map(index_path: str) -> dict[str, str]:
    """`weight_map` of a sharded-safetensors index (`model.safetensors.index.json`): tensor name ->
    shard file name. Every shard name must stay inside the index's directory (`storage.contained`),
    so an index naming `../elsewhere/x.safetensors` or an absolute path reads nothing outside."""
    data = storage.read_json(index_path)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CorruptCheckpointError(f"{index_path}: expected a 'weight_map' object of tensor -> file name")
    base = layout.parent(index_path)
    for shard in sorted(set(weight_map.values())):
        storage.contained(base, shard, f"{index_path.rsplit('/', 1)[-1]}'s weight_map")
    return weight_map


def shard_headers(index_path: str) -> dict[str, SafetensorsHeader]:
    """Tensor name -> the validated header of the shard the index puts it in, each shard read once.
    One line for a shard file that is missing, a shard that is truncated or damaged
    (`read_safetensors_header`), and a tensor the index names that its shard does not hold."""
    weight_map = read_weight_map(index_path)
    model_dir = layout.parent(index_path)
    headers: dict[str, SafetensorsHeader] = {}
    for shard in sorted(set(weight_map.values())):
        path = layout.join(model_dir, shard)
        if not storage.exists(path):
            raise CheckpointNotFoundError(
                f"{index_path} names {shard}, which is missing; re-copy the whole sharded set"
            )
        headers[shard] = read_safetensors_header(path)
    for name, shard in sorted(weight_map.items()):
        if name not in headers[shard].tensors:
            raise CorruptCheckpointError(
                f"{index_path} puts {name} in {shard}, which does not hold it; re-copy or re-save the sharded set"
            )
    return {name: headers[shard] for name, shard in weight_map.items()}
