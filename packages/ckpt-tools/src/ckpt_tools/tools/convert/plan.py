"""Where a conversion writes and what it may delete, so that converting never changes what a
checkpoint means: the fp32 master that loaders and resume read stays the one in the step directory.

- A `--dtype` cast is a lower-precision copy: by default it goes to `<step>/export-<dtype>/` (beside
  the shards for a directory outside a step); writing it into the step directory or its
  `pretrained_model/` is refused, and so is deleting the shards it was cast from.
- `--delete-dcp` inside a step only once the safetensors replace the shards in `pretrained_model/`;
  the step's `training_step.json` then names the format it holds.
"""

from __future__ import annotations

import dataclasses
import os

from ckpt_tools.errors import CheckpointError
from ckpt_tools.files import storage
from ckpt_tools.files.manifest import update_manifest
from ckpt_tools.format import layout, weight_sets
from ckpt_tools.format.dtypes import SHORT_DTYPES, dtype_name
from ckpt_tools.format.meta import TrainingStep

# `checkpoint_format` once the model's DCP shards are gone, by the format the step was saved in
_WITHOUT_DCP = {"dcp": "safetensors", "safetensors_dcp": "safetensors"}


def _step_of(model_dir: str) -> str | None:
    """The step directory a `pretrained_model/` belongs to; None for any other directory."""
    if layout.name(model_dir) != layout.PRETRAINED_MODEL_DIR:
        return None
    return layout.parent(model_dir)


def _same(a: str, b: str) -> bool:
    return storage.resolve(a)[1].rstrip("/") == storage.resolve(b)[1].rstrip("/")


def output_dir(
    source: str, output: str | os.PathLike[str] | None, dtype: str | None, delete_dcp: bool
) -> str:
    """The directory a DCP -> safetensors conversion of `source` (a DCP directory) writes into, or a
    one-line refusal when the request would change what the checkpoint means."""
    model_dir = layout.parent(source.rstrip("/"))
    step_dir = _step_of(model_dir)
    out = os.fspath(output).rstrip("/") if output is not None else None
    if dtype is not None:
        if delete_dcp:
            raise CheckpointError(
                f"--delete-dcp with --dtype {dtype} would delete the full-precision shards and keep only "
                "the cast copy: convert without --dtype first, or drop --delete-dcp"
            )
        name = dtype_name(dtype) or dtype
        short = next((k for k, v in SHORT_DTYPES.items() if v == name), name)
        out = out or layout.join(step_dir or model_dir, layout.export_dir_name(short))
        if _same(out, model_dir) or (step_dir is not None and _same(out, step_dir)):
            raise CheckpointError(
                f"--dtype {dtype} writes a lower-precision copy, which must not land in {out}: loaders and "
                f"resume read the full-precision weights there; omit --output (default "
                f"{layout.join(step_dir or model_dir, layout.export_dir_name(short))}) or pass another directory"
            )
        return out
    out = out or model_dir
    if delete_dcp and step_dir is not None and not _same(out, model_dir):
        raise CheckpointError(
            f"--delete-dcp with --output {out} would leave {step_dir} without weights: convert into the "
            "step (omit --output) to replace its shards, or keep them"
        )
    return out


def record_deleted_dcp(source: str) -> None:
    """After the model's (or EMA's) DCP shards of a step of ours were deleted, make `training_step.json` name
    the format the step now holds, so verify and resume read it as it is, and keep the step's
    manifest true (the shards dropped, the step file's new digest)."""
    step_dir = _step_of(layout.parent(source.rstrip("/")))
    if step_dir is None:
        return
    path = layout.join(step_dir, layout.TRAINING_STATE_DIR, layout.TRAINING_STEP)
    if not storage.exists(path):
        return
    try:
        step = TrainingStep.from_json(storage.read_bytes(path), source=path)
    except CheckpointError:
        return  # not ours (LeRobot's has no checkpoint_format): nothing names the format
    # the weights' shards name the format; those of a set overlaying them (`ema_dcp/`) follow it and
    # leave it as it is
    overlays = {kind.dcp_dir for kind in weight_sets.WEIGHT_SETS if kind.overlays}
    now = None if layout.name(source) in overlays else _WITHOUT_DCP.get(step.checkpoint_format)
    rewritten = {}
    if now is not None:
        data = dataclasses.replace(step, checkpoint_format=now).to_json().encode("utf-8")
        storage.write_bytes(path, data)
        rewritten[f"{layout.TRAINING_STATE_DIR}/{layout.TRAINING_STEP}"] = data
    removed = f"{layout.PRETRAINED_MODEL_DIR}/{source.rstrip('/').rsplit('/', 1)[-1]}"
    update_manifest(step_dir, removed=removed, rewritten=rewritten)


def inside(path: str, root: str) -> bool:
    """Whether `path` is `root` or lies below it (after symlinks on local disk); never touches either."""
    fs_path, inner_path = storage.resolve(path)
    fs_root, inner_root = storage.resolve(root)
    if storage.is_local(fs_path) != storage.is_local(fs_root):
        return False
    if storage.is_local(fs_path):
        inner_path, inner_root = os.path.realpath(inner_path), os.path.realpath(inner_root)
    inner_path, inner_root = inner_path.rstrip("/"), inner_root.rstrip("/")
    return inner_path == inner_root or inner_path.startswith(inner_root + "/")


def refuse_inside(path: str, root: str, what: str, root_is: str) -> None:
    if inside(path, root):
        raise CheckpointError(
            f"{what} {path} lies inside {root}, {root_is}: refused; choose a path outside it"
        )
