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
from ckpt_tools.files.safetensors_writer import SafetensorsStreamWriter
from ckpt_tools.state.collective import Group
from ckpt_tools.tensors.tensor_io import tensor_specs, write_tensor_bytes

METADATA = {"format": "pt"}  # what the gathered saves have always written


def write_gathered_safetensors(
    path: str, state: Mapping[str, torch.Tensor], group: Group, recorder: Recorder | None
) -> None:
    """Collective when `state` holds DTensors: call on all ranks with the same names. The main rank
    writes `path`; its failure is kept in `group` for the next `agree` (the others still gather)."""
    specs = tensor_specs(state)
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
