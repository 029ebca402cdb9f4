"""Which weight sets a path holds, in which layout, and which one each reader takes.

Every command and loader asks this module instead of probing for file names itself, so they agree:
`ckpt inspect`, `verify`, `diff`, `convert`, `push`, the loaders, resume and the trainer. Torch-free;
it reads directory listings, `training_step.json` and, for a bare DCP directory, its `.metadata`.

Vocabulary. A weight set has a role (`model`, `adapter`, `ema`: the kinds `format/weight_sets.py`
declares, with their file names; and `optimizer`) and a format (`safetensors`,
`sharded safetensors`, `dcp`); its label is `safetensors`, `dcp`, `adapter safetensors`,
`optimizer dcp`, ... A path is in one layout: ours, LeRobot's, an older release of ours, a model
directory, a single safetensors file, or a bare DCP directory (ours, accelerate's, torchtitan's).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ckpt_tools.dcp.index import read_dcp_index
from ckpt_tools.dcp.roles import MODEL_WRAPPED, OPTIMIZER_STATE, TOP_LEVEL, model_tensors, tensor_roles
from ckpt_tools.errors import CheckpointError
from ckpt_tools.files import locate, storage
from ckpt_tools.files.safetensors_io import read_safetensors_header
from ckpt_tools.format import layout, weight_sets
from ckpt_tools.format.dtypes import FLOATING, ITEMSIZE
from ckpt_tools.format.meta import LeRobotStep, is_lerobot_step
from ckpt_tools.format.weight_sets import WeightSetKind

# roles: the weight sets' kinds, and the optimizer state (which no reader loads as weights)
MODEL = weight_sets.MODEL.name
ADAPTER = weight_sets.ADAPTER.name
EMA = (
    weight_sets.EMA.name
)  # the moving average of the trained parameters, under the names of the weights beside it
OPTIMIZER = "optimizer"

# formats
SAFETENSORS = "safetensors"
SHARDED_SAFETENSORS = "sharded safetensors"
DCP = "dcp"

# layouts
OURS = "ckpt-tools"
LEROBOT = "LeRobot"
OLDER_RELEASE = "older release"
MODEL_DIRECTORY = "model directory"
SAFETENSORS_FILE = "safetensors file"
DCP_DIRECTORY = "DCP directory"
ACCELERATE_DCP = "accelerate DCP"
TORCHTITAN_DCP = "torchtitan DCP"


@dataclass(frozen=True)
class WeightSet:
    """One stored set of tensors: its role, format and the file, index or directory holding it."""

    role: str
    format: str
    path: str

    @property
    def label(self) -> str:
        """`safetensors`, `dcp`, `adapter safetensors`, `optimizer dcp`, ..."""
        return self.format if self.role == MODEL else f"{self.role} {self.format}"


@dataclass(frozen=True)
class Catalog:
    """What a path holds. `step_dir` is None outside a step directory; `model_dir` is where the
    weights and configs lie (the path itself for a DCP directory, a model directory or a file)."""

    path: str
    layout: str
    step_dir: str | None
    model_dir: str
    weight_sets: tuple[WeightSet, ...]
    lerobot_step: LeRobotStep | None = None

    def of_role(self, role: str) -> tuple[WeightSet, ...]:
        return tuple(w for w in self.weight_sets if w.role == role)

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(w.label for w in self.weight_sets)

    @property
    def state_dir(self) -> str | None:
        """`training_state/` of a step directory (which may be missing on disk)."""
        return layout.join(self.step_dir, layout.TRAINING_STATE_DIR) if self.step_dir else None

    def layout_line(self) -> str:
        """`LeRobot layout (step 4, dp_world_size 1, batch_size 2)`, `torchtitan DCP layout`, ..."""
        extra = f" ({self.lerobot_step.describe()})" if self.lerobot_step else ""
        return f"{self.layout} layout{extra}"


def catalog(path: str | os.PathLike[str]) -> Catalog:
    """Catalog a step directory, `checkpoints/last`, an output_dir, a `pretrained_model/`, a model
    directory, one `.safetensors` file or a DCP directory. Reads no tensor bytes."""
    text = os.fspath(path).rstrip("/") or "/"
    if text.endswith(".safetensors") and storage.is_file(text):
        role = ADAPTER if layout.name(text) == layout.ADAPTER_SAFETENSORS else MODEL
        return Catalog(text, SAFETENSORS_FILE, None, text, (WeightSet(role, SAFETENSORS, text),))
    if storage.is_dir(text) and storage.exists(layout.join(text, layout.DCP_METADATA)):
        storage.check_links(text)
        return _dcp_directory(text if layout.is_url(text) else storage.absolute(text))
    step_dir, model_dir = locate.resolve_model_dir(text)
    kind, lerobot = _step_layout(step_dir)
    return Catalog(text, kind, step_dir, model_dir, tuple(_weight_sets(model_dir, step_dir)), lerobot)


def _step_layout(step_dir: str | None) -> tuple[str, LeRobotStep | None]:
    """Whose layout a step directory is in, from its `training_step.json` alone."""
    if step_dir is None:
        return MODEL_DIRECTORY, None
    source = layout.join(step_dir, layout.TRAINING_STATE_DIR, layout.TRAINING_STEP)
    if not storage.exists(source):
        return OURS, None  # an incomplete step of ours: verify says what is missing
    try:
        data: Any = storage.read_json(source)
    except CheckpointError:
        return OURS, None  # damaged: reading it as ours names the problem
    if is_lerobot_step(data):
        return LEROBOT, LeRobotStep.from_dict(data, source)
    if isinstance(data, dict) and "format_version" not in data:
        return OLDER_RELEASE, None
    return OURS, None


def _weight_sets(model_dir: str, step_dir: str | None) -> list[WeightSet]:
    """Every weight set of a step or model directory, in the order `weights_for_loading` prefers."""
    state_dir = layout.join(step_dir, layout.TRAINING_STATE_DIR) if step_dir else None
    candidates = []
    for kind in weight_sets.WEIGHT_SETS:
        candidates.append(WeightSet(kind.name, SAFETENSORS, layout.join(model_dir, kind.safetensors)))
        if kind.index is not None:
            candidates.append(WeightSet(kind.name, SHARDED_SAFETENSORS, layout.join(model_dir, kind.index)))
        candidates.append(WeightSet(kind.name, DCP, layout.join(model_dir, kind.dcp_dir)))
    if state_dir:
        candidates += [
            WeightSet(OPTIMIZER, SAFETENSORS, layout.join(state_dir, layout.OPTIMIZER_SAFETENSORS)),
            WeightSet(OPTIMIZER, DCP, layout.join(state_dir, layout.OPTIMIZER_DCP_DIR)),
        ]
    return [c for c in candidates if storage.exists(c.path)]


def _dcp_directory(path: str) -> Catalog:
    """A bare DCP directory: its roles come from where its tensors sit in the saved state dict
    (see `dcp.roles.tensor_roles`), not from its name; `adapter_model_fsdp_0/` holds an adapter."""
    roles = tensor_roles(read_dcp_index(path, check_files=False))
    name = layout.name(path)
    sets = []
    if set(roles) - {OPTIMIZER_STATE}:
        sets.append(WeightSet(ADAPTER if name == layout.ADAPTER_DCP_DIR else MODEL, DCP, path))
    if OPTIMIZER_STATE in roles:
        sets.append(WeightSet(OPTIMIZER, DCP, path))
    if TOP_LEVEL in roles and OPTIMIZER_STATE in roles:
        kind = TORCHTITAN_DCP  # model tensors at the top level beside a nested optimizer
    elif MODEL_WRAPPED in roles:
        kind = ACCELERATE_DCP  # save_state's `{"model": state_dict}`
    else:
        kind = DCP_DIRECTORY
    return Catalog(path, kind, None, path, tuple(sets))


# --- preference rules ------------------------------------------------------------------------------

_LOADING_ORDER = (
    (MODEL, SAFETENSORS),
    (MODEL, SHARDED_SAFETENSORS),
    (MODEL, DCP),
    (ADAPTER, SAFETENSORS),
    (ADAPTER, DCP),
)


def _first(cat: Catalog, order: tuple[tuple[str, str], ...]) -> WeightSet | None:
    candidates = _full_precision(cat.weight_sets)
    for role, fmt in order:
        for weights in candidates:
            if (weights.role, weights.format) == (role, fmt):
                return weights
    return None


def _full_precision(sets: tuple[WeightSet, ...]) -> tuple[WeightSet, ...]:
    """Leave out a safetensors set narrower than the DCP shards of the same role beside it (a bf16
    copy an older `ckpt convert --dtype` wrote into the step): the full-precision master wins."""
    kept = []
    for weights in sets:
        shards = next((w for w in sets if w.role == weights.role and w.format == DCP), None)
        narrower = (
            weights.format != DCP
            and weights.role != OPTIMIZER
            and shards is not None
            and _narrower(_float_widths(weights), _float_widths(shards))
        )
        if not narrower:
            kept.append(weights)
    return tuple(kept)


def _narrower(copy: dict[str, int], master: dict[str, int]) -> bool:
    """Whether some floating tensor has fewer bytes per element in `copy` than in `master`."""
    return any(width < master[name] for name, width in copy.items() if name in master)


def _float_widths(weights: WeightSet) -> dict[str, int]:
    """Bytes per element of each floating tensor of a weight set, from its metadata alone."""
    if weights.format == DCP:
        index = read_dcp_index(weights.path, check_files=False)
        dtypes = {name: entry.dtype for name, entry in model_tensors(index).items()}
    else:
        headers = [weights.path]
        if weights.format == SHARDED_SAFETENSORS:
            base = layout.parent(weights.path)
            shards = storage.read_json_object(weights.path).get("weight_map", {})
            headers = [layout.join(base, shard) for shard in sorted(set(shards.values()))]
        dtypes = {n: i.dtype for h in headers for n, i in read_safetensors_header(h).tensors.items()}
    return {name: ITEMSIZE[dtype] for name, dtype in dtypes.items() if dtype in FLOATING}


def weights_for_loading(cat: Catalog) -> WeightSet | None:
    """What a full-state-dict reader loads (evaluation, `--policy.path`, diff, merge-adapter): the
    model's safetensors (cheapest to read), else its DCP shards; an adapter when there is no model.
    Optimizer state never."""
    return _first(cat, _LOADING_ORDER)


def weights_for_resume(cat: Catalog, *, sharded: bool) -> WeightSet | None:
    """What a resume loads into the prepared model: the adapter of a PEFT step (a PEFT run trains
    only it), else the model; a sharded run reads the DCP shards (each rank only its part) when
    present, a non-sharded run the full safetensors file when present."""
    role = ADAPTER if cat.of_role(ADAPTER) else MODEL
    files = ((role, SAFETENSORS), (role, SHARDED_SAFETENSORS))
    shards = ((role, DCP),)
    return _first(cat, shards + files if sharded else files + shards)


def overlay_for_resume(cat: Catalog, kind: WeightSetKind, *, sharded: bool) -> WeightSet | None:
    """The set of a kind that overlays the weights (the EMA shadow) a resume loads, by the model's rule
    (`weights_for_resume`): DCP shards first on a sharded run, the gathered file first otherwise. None
    for a step saved without it."""
    order = ((kind.name, DCP), (kind.name, SAFETENSORS))
    return _first(cat, order if sharded else order[::-1])


def overlay_for_loading(cat: Catalog, kind: WeightSetKind) -> WeightSet | None:
    """The set of a kind that overlays the weights (the EMA shadow) a full-state-dict reader loads: the
    gathered file (cheapest), else the shards."""
    return _first(cat, ((kind.name, SAFETENSORS), (kind.name, DCP)))


def weights_for_publishing(cat: Catalog) -> WeightSet | None:
    """What the Hub can load as it is: the model's safetensors (single or sharded), else an adapter's.
    None when the weights are DCP shards only (convert them first)."""
    return _first(cat, ((MODEL, SAFETENSORS), (MODEL, SHARDED_SAFETENSORS), (ADAPTER, SAFETENSORS)))


def weights_for_report(cat: Catalog) -> WeightSet | None:
    """What `ckpt inspect` tabulates and `ckpt diff` compares: the loading choice, or the optimizer
    state of a directory holding nothing else (a bare `optimizer_0/`)."""
    return weights_for_loading(cat) or next(iter(cat.of_role(OPTIMIZER)), None)
