"""The optimizer state of a non-sharded run as `optimizer_state.safetensors` + JSON param groups.

Tensors are keyed `state/<param fqn>/<name>` (exp_avg, step, ...) and `param_groups/<i>/<key>` for a
tensor-valued hyperparameter; the JSON file is the list of param groups with `params` as names.
Non-tensor per-parameter values (SGD's None momentum buffer) go in the file's `state_extras` metadata.
"""

from __future__ import annotations

import json
from typing import Any

import torch

from ckpt_tools.errors import CorruptCheckpointError
from ckpt_tools.files import manifest, storage
from ckpt_tools.files.digest import Recorder
from ckpt_tools.files.safetensors_io import SafetensorsHeader, read_safetensors_header
from ckpt_tools.format import layout
from ckpt_tools.format.untrusted import MAX_CONFIG_BYTES, check_like, describe, parse_json
from ckpt_tools.tensors.tensor_io import read_safetensors, read_safetensors_block, stream_safetensors


def write_optimizer_safetensors(
    state_dir: str, osd: dict[str, Any], recorder: Recorder | None = None
) -> None:
    """Write a full (gathered) optimizer state dict into `state_dir` as the two files above, the
    tensors from their own memory (the optimizer's state is the largest part of a save)."""
    tensors, param_groups, extras = flatten_optimizer(osd)
    meta = {"state_extras": json.dumps(extras)} if extras else None
    stream_safetensors(layout.join(state_dir, layout.OPTIMIZER_SAFETENSORS), tensors, meta, recorder)
    manifest.write_json(layout.join(state_dir, layout.OPTIMIZER_PARAM_GROUPS), param_groups, recorder)


def flatten_optimizer(osd: dict[str, Any]) -> tuple[dict[str, torch.Tensor], list[dict[str, Any]], dict]:
    """Split a name-keyed optimizer state dict into tensors, JSON param groups and non-tensor extras."""
    tensors: dict[str, torch.Tensor] = {}
    extras: dict[str, dict[str, Any]] = {}  # non-tensor per-parameter values (SGD's None buffer)
    for fqn, param_state in osd["state"].items():
        for name, value in param_state.items():
            if torch.is_tensor(value):
                tensors[f"state/{fqn}/{name}"] = value
            else:
                extras.setdefault(fqn, {})[name] = value
    groups = []
    for index, group in enumerate(osd["param_groups"]):
        plain = {}
        for key, value in group.items():
            if torch.is_tensor(value):
                tensors[f"param_groups/{index}/{key}"] = value
            else:
                plain[key] = value
        groups.append(plain)
    return tensors, groups, extras


def read_optimizer_safetensors(state_dir: str, optimizer: torch.optim.Optimizer | None = None) -> dict:
    """The name-keyed optimizer state dict of a non-sharded run. JSON has no tuples: a list is turned
    back into a tuple where `optimizer`'s own value is one (AdamW's betas), so the round trip is exact."""
    tensors, metadata = read_safetensors(layout.join(state_dir, layout.OPTIMIZER_SAFETENSORS))
    return _assemble(state_dir, tensors, metadata, optimizer)


def read_optimizer_skeleton(
    state_dir: str, optimizer: torch.optim.Optimizer | None = None
) -> tuple[dict, SafetensorsHeader]:
    """The same state dict without its per-parameter tensors (param groups, with any tensor-valued
    hyperparameter, and the non-tensor per-parameter values), and the file's header to read those
    tensors from block by block: what a sharded model needs, without the whole file in memory."""
    header = read_safetensors_header(layout.join(state_dir, layout.OPTIMIZER_SAFETENSORS))
    hyper = {
        key: read_safetensors_block(header, key, (0,) * len(info.shape), info.shape)
        for key, info in header.tensors.items()
        if key.startswith("param_groups/")
    }
    return _assemble(state_dir, hyper, header.metadata, optimizer), header


def _assemble(
    state_dir: str,
    tensors: dict[str, torch.Tensor],
    metadata: dict[str, str],
    optimizer: torch.optim.Optimizer | None,
) -> dict:
    """The state dict from the file's tensors, its metadata and the JSON param groups, each part
    checked (these files are untrusted: a resume refuses them in one line before it loads anything)."""
    groups_path = layout.join(state_dir, layout.OPTIMIZER_PARAM_GROUPS)
    groups = _param_groups(groups_path, optimizer)
    file = layout.join(state_dir, layout.OPTIMIZER_SAFETENSORS)
    state = parse_json(
        metadata.get("state_extras", "{}").encode("utf-8", "surrogatepass"), f"{file}: state_extras"
    )
    if not (isinstance(state, dict) and all(isinstance(v, dict) for v in state.values())):
        raise CorruptCheckpointError(
            f"{file}: metadata state_extras is {describe(state)}, not an object of objects"
        )
    for key, tensor in tensors.items():
        kind, owner, name = _tensor_key(key, len(groups), file)
        if kind == "state":
            state.setdefault(owner, {})[name] = tensor
        else:
            groups[int(owner)][name] = tensor
    if optimizer is not None:
        for index, (group, live) in enumerate(zip(groups, optimizer.param_groups, strict=True)):
            check_like(_without_params(group), _without_params(live), f"{groups_path}[{index}]")
        restore_tuples(groups, optimizer.param_groups)
    return {"state": state, "param_groups": groups}


def _param_groups(path: str, optimizer: torch.optim.Optimizer | None) -> list[dict[str, Any]]:
    """`optimizer_param_groups.json`: a list of objects whose `params` are parameter names, one per
    group of the optimizer it goes into."""
    groups = storage.read_json(path, MAX_CONFIG_BYTES)
    if not isinstance(groups, list) or not all(
        isinstance(g, dict)
        and isinstance(g.get("params"), list)
        and all(isinstance(p, str) for p in g["params"])
        for g in groups
    ):
        raise CorruptCheckpointError(
            f"{path} is {describe(groups)}, not a list of param groups naming their parameters; the file is damaged"
        )
    if optimizer is not None and len(groups) != len(optimizer.param_groups):
        raise CorruptCheckpointError(
            f"{path} holds {len(groups)} param groups and this optimizer {len(optimizer.param_groups)}; "
            "resume with the optimizer settings the checkpoint was trained with"
        )
    return groups


def _tensor_key(key: str, groups: int, file: str) -> tuple[str, str, str]:
    """`state/<param fqn>/<name>` or `param_groups/<i>/<key>` split, anything else refused."""
    kind, _, rest = key.partition("/")
    owner, _, name = rest.rpartition("/")
    index_ok = kind != "param_groups" or (owner.isdigit() and len(owner) < 7 and int(owner) < groups)
    if kind not in ("state", "param_groups") or not owner or not name or not index_ok:
        raise CorruptCheckpointError(
            f"{file} holds the tensor {describe(key)}, which is neither state/<param>/<name> nor "
            f"param_groups/<i>/<key> of its {groups} groups; the file is damaged"
        )
    return kind, owner, name


def _without_params(group: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in group.items() if key != "params"}


def restore_tuples(groups: list[dict[str, Any]], like: list[dict[str, Any]]) -> None:
    """Turn lists back into tuples where `like` (the live optimizer's groups) holds a tuple."""
    for group, live in zip(groups, like, strict=False):
        for key, value in group.items():
            if isinstance(value, list) and isinstance(live.get(key), tuple):
                group[key] = tuple(value)
