"""safetensors -> DCP: a model's safetensors weights written as a DCP directory (one rank's plan), which
replaces an existing one only once it is complete."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ckpt_tools.catalog import ADAPTER, MODEL, SAFETENSORS, SHARDED_SAFETENSORS, catalog
from ckpt_tools.errors import NotACheckpointError, OutputExistsError
from ckpt_tools.files import storage
from ckpt_tools.files.safetensors_io import read_safetensors_header
from ckpt_tools.files.sharded_safetensors import read_weight_map
from ckpt_tools.format import layout
from ckpt_tools.format.dtypes import ITEMSIZE
from ckpt_tools.tools.convert.chunk_copy import torch_dtype
from ckpt_tools.tools.convert.plan import refuse_inside
from ckpt_tools.tools.convert.result import ConversionResult


def convert_safetensors_to_dcp(
    path: str | os.PathLike[str],
    output: str | os.PathLike[str] | None = None,
    *,
    overwrite: bool = False,
) -> ConversionResult:
    """Turn `model.safetensors` (or a sharded set with its index, or `adapter_model.safetensors`) into
    a DCP directory that a sharded run loads onto any topology (to start FSDP2 from published weights).

    `path`: a model directory, a step directory or a `.safetensors` file. `output`: the DCP directory;
    default `pytorch_model_fsdp_0/` (`adapter_model_fsdp_0/` for an adapter) beside the input. Tensors
    are memory-mapped, not read into RAM. Written under a temporary name and renamed when complete.
    """
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    from ckpt_tools.tensors.tensor_io import quiet_single_process  # here, not at the top: it imports torch

    files, default_out = _find_safetensors_source(path)
    out = os.fspath(output).rstrip("/") if output is not None else default_out
    for file in files:
        refuse_inside(file, out, "the input", f"--output {out}, which would be replaced")
    if storage.exists(out) and not overwrite:
        raise OutputExistsError(f"{out} already exists; pass --overwrite to replace it")
    fs, inner_out = storage.resolve(out)
    if fs.exists(inner_out) and not fs.isdir(inner_out):
        raise OutputExistsError(f"{out} is a file, not a DCP directory; --overwrite replaces only DCP files")
    parent, name = layout.parent(out), layout.name(out)
    tmp = layout.join(parent, layout.TMP_PREFIX + name)
    storage.remove_tree(tmp)
    with _mapped_tensors(files) as state:
        try:
            with quiet_single_process():
                dcp_save(state, checkpoint_id=tmp, no_dist=True)
        except BaseException:
            storage.remove_tree(tmp)
            raise
        count, total = len(state), sum(t.numel() * t.element_size() for t in state.values())
    _replace_dcp_files(tmp, out)
    return ConversionResult(files[0], (out,), None, count, total, None, False)


_DCP_FILE = re.compile(r"^(\.metadata|__\d+_\d+\.distcp)$")


def _replace_dcp_files(tmp: str, out: str) -> None:
    """Move a DCP directory written under `tmp` into `out`: a new `out` is one rename; into an
    existing one, only the files DCP writes (`.metadata`, `__<rank>_<i>.distcp`) are replaced, the old
    ones removed first and `.metadata` moved last, so nothing else in `out` is ever touched."""
    fs, inner_tmp = storage.resolve(tmp)
    inner_out = storage.resolve(out)[1]
    local = storage.is_local(fs)
    if not fs.exists(inner_out):
        if local:
            os.rename(inner_tmp, inner_out)
        else:
            storage.move_tree(fs, inner_tmp, inner_out)
        return
    for name in storage.list_names(out):
        if _DCP_FILE.match(name):
            fs.rm(f"{inner_out}/{name}")
    for name in sorted(storage.list_names(tmp), key=lambda n: n == layout.DCP_METADATA):
        if local:
            os.replace(f"{inner_tmp}/{name}", f"{inner_out}/{name}")
        else:
            fs.mv(f"{inner_tmp}/{name}", f"{inner_out}/{name}")
    storage.remove_tree(tmp)


def _find_safetensors_source(path: str | os.PathLike[str]) -> tuple[list[str], str]:
    """(safetensors files to read, default DCP output directory)."""
    text = os.fspath(path).rstrip("/")
    if text.endswith(".safetensors"):
        model_dir, name = layout.parent(text), layout.name(text)
        dcp_name = layout.ADAPTER_DCP_DIR if name == layout.ADAPTER_SAFETENSORS else layout.MODEL_DCP_DIR
        return [text], layout.join(model_dir, dcp_name)
    cat = catalog(text)
    order = ((MODEL, SHARDED_SAFETENSORS), (MODEL, SAFETENSORS), (ADAPTER, SAFETENSORS))
    for role, fmt in order:
        for weights in cat.of_role(role):
            if weights.format != fmt:
                continue
            dcp_name = layout.ADAPTER_DCP_DIR if role == ADAPTER else layout.MODEL_DCP_DIR
            if fmt == SHARDED_SAFETENSORS:
                shards = sorted(set(read_weight_map(weights.path).values()))
                return [layout.join(cat.model_dir, s) for s in shards], layout.join(cat.model_dir, dcp_name)
            return [weights.path], layout.join(cat.model_dir, dcp_name)
    raise NotACheckpointError(
        f"{text} has no {layout.MODEL_SAFETENSORS}, {layout.MODEL_INDEX} or {layout.ADAPTER_SAFETENSORS}"
    )


@contextmanager
def _mapped_tensors(files: list[str]) -> Iterator[dict[str, Any]]:
    """Every tensor of the files as a CPU tensor over a private memory map. A file on a store is first
    streamed to a local temporary file, so memory stays bounded whatever its size. A map is released
    with the last tensor viewing it."""
    import mmap
    import tempfile

    import torch

    state: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="ckpt-convert-") as downloads:
        try:
            for number, file in enumerate(files):
                header = read_safetensors_header(file)
                fs, inner = storage.resolve(file)
                if not storage.is_local(fs):
                    fs.get_file(inner, f"{downloads}/{number}.safetensors")
                    inner = f"{downloads}/{number}.safetensors"
                with open(inner, "rb") as handle:
                    buffer = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
                _view_tensors(header, buffer, state, torch)
            yield state
        finally:
            state.clear()


def _view_tensors(header: Any, buffer: Any, state: dict[str, Any], torch: Any) -> None:
    """Add every tensor of one mapped safetensors file to `state`, as views of the map."""
    for name, info in header.tensors.items():
        count = info.nbytes // ITEMSIZE[info.dtype]
        dtype = torch_dtype(info.dtype)
        start = header.data_start + info.data_offsets[0]
        flat = (
            torch.frombuffer(buffer, dtype=dtype, count=count, offset=start)
            if count
            else torch.empty(0, dtype=dtype)
        )
        state[name] = flat.reshape(info.shape)
