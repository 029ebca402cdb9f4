"""A gathered safetensors file written tensor by tensor: no full copy of the model in any process.

`safetensors.torch.save` needs every tensor in memory at once and, to hash the file for the manifest,
serializes it into one bytes object first: a single process's save held its model twice, and a sharded
run's main rank gathered the whole model before writing. Here the header is built from names, dtypes
and shapes alone (`files/safetensors_writer.py`, the library's layout: widest dtype first, then by
name), then each tensor is written in file order: a plain tensor from its own memory (no copy), a
sharded one gathered (`full_tensor`, a collective every rank runs in the same order), written by the
main rank and freed before the next. The manifest's digest is taken from the bytes as they pass. The
file has the bytes `safetensors.torch.save` writes for the gathered state
(tests/ckpt/test_gathered_write.py); peak memory on the main rank is its shard plus one tensor.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch.distributed.tensor import DTensor

from ckpt_tools.files.digest import Recorder
from ckpt_tools.files.manifest import write_json
from ckpt_tools.files.safetensors_writer import SafetensorsStreamWriter, TensorSpec
from ckpt_tools.files.sharded_safetensors import index_document, plan_shards
from ckpt_tools.format import layout
from ckpt_tools.state.collective import Group
from ckpt_tools.tensors.tensor_io import tensor_spec, write_tensor_bytes

METADATA = {"format": "pt"}  # what the gathered saves have always written


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
    """One file, its tensors in `specs` order: each gathered, written by the main rank, freed."""
    writers: list[SafetensorsStreamWriter] = []
    group.on_main(lambda: writers.append(SafetensorsStreamWriter(path, specs, METADATA, recorder)))
    for spec in specs:
        value = state[spec.name]
        full = value.full_tensor() if isinstance(value, DTensor) else value
        group.on_main(_write, writers, full)
        del full  # a gathered tensor is freed before the next is gathered
    group.on_main(_finish, writers)


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
