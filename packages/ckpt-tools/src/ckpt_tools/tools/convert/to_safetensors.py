"""DCP -> safetensors: the header planned from the DCP chunk table, then each tensor's bytes copied from
its chunks in file order (a kernel copy where no byte changes; `chunk_copy.py` otherwise), into one
file or shards of at most `--max-shard-size` with their index."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence

from ckpt_tools.catalog import ADAPTER, DCP, MODEL, catalog
from ckpt_tools.dcp.chunk_tiling import check_tiling
from ckpt_tools.dcp.index import TensorEntry, read_dcp_index
from ckpt_tools.dcp.roles import model_tensors
from ckpt_tools.errors import CorruptCheckpointError, NotACheckpointError, OutputExistsError, UsageError
from ckpt_tools.files import storage
from ckpt_tools.files.safetensors_io import read_safetensors_header
from ckpt_tools.files.safetensors_writer import SafetensorsStreamWriter, TensorSpec
from ckpt_tools.files.sharded_safetensors import Shards, index_document, parse_size, plan_shards
from ckpt_tools.format import layout, weight_sets
from ckpt_tools.format.dtypes import FLOATING, USER_DTYPES, dtype_name
from ckpt_tools.format.weight_sets import WeightSetKind
from ckpt_tools.tools import companions
from ckpt_tools.tools.convert import plan
from ckpt_tools.tools.convert.chunk_copy import OpenFiles, write_tensor
from ckpt_tools.tools.convert.plan import refuse_inside
from ckpt_tools.tools.convert.result import ConversionResult, Progress

_Advance = Callable[[int], None]
SAFETENSORS_METADATA = {"format": "pt"}  # transformers refuses files without it


def convert_dcp_to_safetensors(
    path: str | os.PathLike[str],
    output: str | os.PathLike[str] | None = None,
    *,
    dtype: str | None = None,
    max_shard_size: str | int | None = None,
    delete_dcp: bool = False,
    keep_source: bool = False,
    overwrite: bool = False,
    progress: Progress | None = None,
    weights: str = "model",
) -> ConversionResult:
    """Convert the DCP model (or PEFT adapter) shards of a checkpoint into safetensors, streaming.

    `path`: a step directory, `checkpoints/last`, a `pretrained_model/`, or a bare DCP directory
    (accelerate's `pytorch_model_fsdp_0/` included). `output`: the directory to write into; default
    beside the shards. `dtype`: `bf16`/`fp16`/`fp32`/`fp64` casts floating tensors, others untouched;
    a cast is a copy that never replaces the full-precision weights (`plan.py`): it defaults to
    `<step>/export-<dtype>/`.
    `max_shard_size` (`5GB`): write `model-0000k-of-0000n.safetensors` plus the index transformers
    reads. Only model weights are written (a combined model+optimizer DCP keeps its `model` part).
    Files are written under temporary names, re-read and checked against the DCP metadata, then
    renamed; `delete_dcp` removes the shards only after that (`keep_source`: plan and check as for
    a deletion, but leave it to the caller, who deletes with `delete_source` after a publish). Peak memory stays at a copy buffer
    (or the largest tensor split along an inner dimension), whatever the model size.
    `weights="ema"` converts the step's EMA shards (`ema_dcp/`) into `ema.safetensors` the same way
    instead (one file; deleting them leaves the step's `checkpoint_format` as it is).
    """
    source, stem = _find_dcp_source(path, weights)
    target = _target_dtype(dtype)
    out_dir = plan.output_dir(source, output, dtype, delete_dcp)
    if delete_dcp:
        refuse_inside(out_dir, source, "--output", "the DCP directory that --delete-dcp removes")
    index = read_dcp_index(source)
    tensors = model_tensors(index)
    if not tensors:
        raise NotACheckpointError(f"{source} holds no model tensors; nothing to convert")
    for entry in tensors.values():
        check_tiling(entry, source)  # no hole, no element twice, before the first byte is written
    shards = _plan_shards(tensors, target, stem, parse_size(max_shard_size) if max_shard_size else None)
    _check_outputs(out_dir, stem, overwrite)
    model_dir = layout.parent(source)  # the configs and processors beside the shards
    extra = companions.companion_names(model_dir, adapter=stem != "model")
    companions.check_companions(model_dir, out_dir, extra, overwrite)
    total = sum(spec.nbytes for _, specs in shards for spec in specs)
    paths = _write_shards(source, out_dir, tensors, shards, _advance(progress, total))
    index_file = _write_index(out_dir, shards) if len(shards) > 1 else None
    _remove_stale(out_dir, stem, {name for name, _ in shards})
    copied = companions.copy_companions(model_dir, out_dir, extra)
    deleted = delete_dcp and not keep_source
    if deleted:
        delete_source(source)
    return ConversionResult(
        source, tuple(paths), index_file, len(tensors), total, target, deleted, tuple(copied)
    )


def delete_source(source: str) -> None:
    """Remove converted DCP shards; a step's `training_step.json` then names what it holds."""
    storage.remove_tree(source)
    plan.record_deleted_dcp(source)


def check_deletable_source(
    path: str | os.PathLike[str], output: str | os.PathLike[str] | None, weights: str = "model"
) -> str:
    """The DCP directory a conversion of `path` reads, refused (before anything is written) when the
    output directory would lie inside it, since deleting the shards would delete the output too."""
    source, _ = _find_dcp_source(path, weights)
    out_dir = plan.output_dir(source, output, None, delete_dcp=True)
    refuse_inside(out_dir, source, "--output", "the DCP directory that --delete-dcp removes")
    return source


def _advance(progress: Progress | None, total: int) -> _Advance:
    """Count written bytes into `progress`; a no-op without one."""
    if progress is None:
        return lambda count: None
    done = 0

    def advance(count: int) -> None:
        nonlocal done
        done += count
        progress(done, total)

    progress(0, total)
    return advance


def _find_dcp_source(path: str | os.PathLike[str], weights: str = "model") -> tuple[str, str]:
    """(DCP directory, output stem `model`, `adapter_model` or `ema`), from the catalog of `path`."""
    kind = weight_sets.choose(weights)
    if kind.overlays is not None:
        return _overlay_source(path, kind)
    found = [w for w in catalog(path).weight_sets if w.format == DCP and w.role in (MODEL, ADAPTER)]
    if not found:
        raise NotACheckpointError(
            f"{os.fspath(path)} has no DCP shards ({layout.MODEL_DCP_DIR}/ or {layout.ADAPTER_DCP_DIR}/ "
            f"with a {layout.DCP_METADATA}); it needs no conversion, or pass the DCP directory itself"
        )
    source = next((w for w in found if w.role == ADAPTER), found[0])
    is_adapter = source.role == ADAPTER
    return source.path, _stem(layout.ADAPTER_SAFETENSORS if is_adapter else layout.MODEL_SAFETENSORS)


def _overlay_source(path: str | os.PathLike[str], kind: WeightSetKind) -> tuple[str, str]:
    """The DCP shards of a set that overlays the weights (the EMA), converted into its own file."""
    sets = [w for w in catalog(path).weight_sets if w.role == kind.name]
    shards = next((w for w in sets if w.format == DCP), None)
    if shards is None and not sets:
        raise weight_sets.missing(os.fspath(path), kind)
    if shards is None:
        raise NotACheckpointError(
            f"{os.fspath(path)} holds its {kind.label} weights as {kind.safetensors} already, without "
            f"{kind.dcp_dir}/: it needs no conversion"
        )
    return shards.path, _stem(kind.safetensors)


def _stem(file_name: str) -> str:
    return file_name.removesuffix(".safetensors")


def _target_dtype(dtype: str | None) -> str | None:
    if dtype is None:
        return None
    name = dtype_name(dtype)
    if name is None:
        raise UsageError(f"--dtype {dtype!r} is not one of {', '.join(USER_DTYPES)}", option="--dtype")
    return USER_DTYPES[name]


def _out_dtype(entry: TensorEntry, target: str | None) -> str:
    return target if target is not None and entry.dtype in FLOATING else entry.dtype


def _plan_shards(
    tensors: dict[str, TensorEntry], target: str | None, stem: str, max_size: int | None
) -> Shards:
    """huggingface_hub's split over the tensors in name order (`plan_shards`); inside a file, tensors are
    in aligned order."""
    specs = [TensorSpec(name, _out_dtype(e, target), e.shape) for name, e in sorted(tensors.items())]
    shards = plan_shards(specs, max_size, stem)
    if len(shards) > 1 and stem != _stem(layout.MODEL_SAFETENSORS):
        raise UsageError(
            "adapters and the EMA are written as one file (no reader takes an index); drop --max-shard-size",
            option="--max-shard-size",
        )
    return shards


def _sharded_name(stem: str) -> re.Pattern[str]:
    return re.compile(rf"^{re.escape(stem)}-\d{{5}}-of-\d{{5}}\.safetensors$")


def _existing_outputs(out_dir: str, stem: str) -> list[str]:
    pattern = _sharded_name(stem)
    names = storage.list_names(out_dir)
    fixed = {f"{stem}.safetensors", f"{stem}.safetensors.index.json"}
    return sorted(n for n in names if n in fixed or pattern.match(n))


def _check_outputs(out_dir: str, stem: str, overwrite: bool) -> None:
    existing = _existing_outputs(out_dir, stem)
    if existing and not overwrite:
        raise OutputExistsError(
            f"{layout.join(out_dir, existing[0])} already exists; pass --overwrite to replace it"
        )


def _remove_stale(out_dir: str, stem: str, written: set[str]) -> None:
    """After an overwrite, drop the files of the other layout (old shards, old index or single file)."""
    fs, inner = storage.resolve(out_dir)
    for name in _existing_outputs(out_dir, stem):
        if name not in written and not (len(written) > 1 and name == f"{stem}.safetensors.index.json"):
            fs.rm(f"{inner}/{name}")


def _write_shards(
    source: str,
    out_dir: str,
    tensors: dict[str, TensorEntry],
    shards: Shards,
    progress: _Advance,
) -> list[str]:
    """Write every shard under a temporary name, check each, then rename them all."""
    storage.makedirs(out_dir)
    writers: list[SafetensorsStreamWriter] = []
    try:
        with OpenFiles(source) as files:
            for file_name, specs in shards:
                writer = SafetensorsStreamWriter(layout.join(out_dir, file_name), specs, SAFETENSORS_METADATA)
                writers.append(writer)
                for spec in specs:
                    write_tensor(writer, tensors[spec.name], spec.dtype, files, progress)
                writer.close()
                _check_written(writer.tmp_path, specs)
    except BaseException:
        for writer in writers:
            writer.discard()
        raise
    for writer in writers:
        writer.commit()
    return [writer.path for writer in writers]


def _check_written(path: str, specs: Sequence[TensorSpec]) -> None:
    """Re-read the header just written: names, dtypes, shapes and byte counts as planned."""
    header = read_safetensors_header(path)
    got = {name: (i.dtype, i.shape, i.nbytes) for name, i in header.tensors.items()}
    want = {s.name: (s.dtype, s.shape, s.nbytes) for s in specs}
    if got != want:
        raise CorruptCheckpointError(f"{path}: the written header does not match the DCP metadata")


def _write_index(out_dir: str, shards: Shards) -> str:
    """`model.safetensors.index.json` in the layout transformers and huggingface_hub read."""
    path = layout.join(out_dir, layout.MODEL_INDEX)
    tmp = layout.join(out_dir, layout.TMP_PREFIX + layout.MODEL_INDEX)
    storage.write_text(tmp, json.dumps(index_document(shards), indent=2) + "\n")
    fs, inner = storage.resolve(tmp)
    fs.mv(inner, storage.resolve(path)[1])
    return path
