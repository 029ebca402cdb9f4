"""Which tensors of a DCP directory are model weights and which optimizer state, whatever the tool
that saved it nested them under.

Tools nest their state differently:
  ours, torch's plain `dcp.save(model_sd)`         model tensors at the top level
  accelerate's save_state (FSDP)                  `{"model": sd}` in pytorch_model_fsdp_0/,
                                                  `{"optimizer": osd}` in optimizer_0/
  torchtitan's CheckpointManager                  model tensors at the top level beside a nested
                                                  `optimizer` (and lr_scheduler, dataloader, ...)
  torch's get_state_dict pair                     `{"model": sd, "optim": osd}`
Optimizer state is recognised by its root key, nested or flattened (`optimizer.state.w.exp_avg`, or a
flattened optimizer state dict's own `state.` / `param_groups.` keys at the top level), so a model
whose top-level module is itself called `optimizer` or `state` would be misread: none is.
"""

from __future__ import annotations

import re

from ckpt_tools.dcp.index import DcpIndex, TensorEntry
from ckpt_tools.errors import (
    NotACheckpointError,
)
from ckpt_tools.format import layout

_MODEL_ROOT = "model"
_OPTIMIZER_ROOT = re.compile(
    r"^(optim|optimizer|optimizers|optimizer_state|optim_state)(_\d+)?$|^(state|param_groups)$"
)

# (in angle brackets, so no root key of a saved state dict is mistaken for one)
MODEL_WRAPPED = "<model>"  # tensors under a `model` entry
TOP_LEVEL = "<top level>"  # tensors saved at the top level of the state dict
OPTIMIZER_STATE = "<optimizer>"  # tensors under an optimizer root


def tensor_roles(index: DcpIndex) -> dict[str, list[str]]:
    """The tensor keys of a DCP directory by where they sit: `MODEL_WRAPPED`, `TOP_LEVEL`,
    `OPTIMIZER_STATE`, or the name of any other root entry they are nested under."""
    roles: dict[str, list[str]] = {}
    for name in index.tensors:
        path = index.paths.get(name)
        root = path[0] if path and len(path) > 1 else None
        first = name.split(".", 1)[0]
        if root is None and "." in name and _OPTIMIZER_ROOT.match(first):
            root = first  # a flattened optimizer state dict (`state.<param>.exp_avg`) or prefix
        if root is None:
            role = TOP_LEVEL
        elif root == _MODEL_ROOT:
            role = MODEL_WRAPPED
        elif _OPTIMIZER_ROOT.match(root):
            role = OPTIMIZER_STATE
        else:
            role = root
        roles.setdefault(role, []).append(name)
    return roles


def model_tensors(index: DcpIndex) -> dict[str, TensorEntry]:
    """The model weights of a DCP checkpoint, under their model state-dict names; optimizer state is
    never returned, in any layout.

    Tensors under a `model` entry lose that wrapper; top-level tensors keep their names. A directory
    whose weights cannot be told apart (top-level tensors beside a `model` entry, or tensors nested
    under a root that is neither) is refused rather than guessed; one holding only optimizer state
    raises too.
    """
    if not index.tensors:
        raise NotACheckpointError(
            f"{index.path} holds no tensors ({len(index.objects)} other entries): no model weights"
        )
    roles = tensor_roles(index)
    candidates = sorted(role for role in roles if role != OPTIMIZER_STATE)
    if not candidates:
        raise NotACheckpointError(
            f"{index.path} holds optimizer state only, no model weights: convert the model's "
            f"DCP directory ({layout.MODEL_DCP_DIR}/) instead"
        )
    if len(candidates) > 1 or candidates[0] not in (MODEL_WRAPPED, TOP_LEVEL):
        where = ", ".join(
            "the top level" if r == TOP_LEVEL else repr(_MODEL_ROOT if r == MODEL_WRAPPED else r)
            for r in candidates
        )
        raise NotACheckpointError(
            f"{index.path} holds tensors under {where}: which are the model weights is ambiguous; "
            "save the model alone (or under 'model') and the optimizer under 'optimizer'"
        )
    if candidates[0] == MODEL_WRAPPED:
        return {".".join(index.paths[name][1:]): index.tensors[name] for name in roles[MODEL_WRAPPED]}
    return {name: index.tensors[name] for name in roles[TOP_LEVEL]}


def optimizer_tensors(index: DcpIndex) -> dict[str, TensorEntry]:
    """The optimizer-state tensors of a DCP checkpoint, under their saved (flattened) keys."""
    return {name: index.tensors[name] for name in tensor_roles(index).get(OPTIMIZER_STATE, [])}
