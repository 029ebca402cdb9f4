"""The weight sets a step can hold, declared once: their files, their tensor names, and how a reader
chooses one.

A weight set is one state dict stored in a model directory under files of its own: a safetensors file
(or, for the model, shards and their index) and a DCP directory, by the step's format rule. `model`
holds the trained weights; `adapter` stands in for them in a PEFT step (the only weights such a run
trains); `ema` is the moving average of the trained parameters, under the names of the weights beside
it, so a reader asking for it gets the model's state dict with those tensors replaced.

The catalog lists a path's sets from this table, the loaders, `convert --weights`, `push --weights`
and the trainer choose one through `choose` (one message for a name that is no weight set) and report
a missing one with `missing` (one message). A save writes, and a resume fills, the sets that overlay the
model from one mapping by name (`SaveRequest(extra_weights={"ema": shadow})`,
`load_training_state(extra_weights=...)`, each set checked with `extra`): adding a weight set is one
entry in `WEIGHT_SETS` plus the code that produces it (the trainer's EMA for `ema`). Torch-free.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from ckpt_tools.errors import NotACheckpointError, UsageError
from ckpt_tools.format import layout


@dataclass(frozen=True)
class WeightSetKind:
    """One kind of weight set. `name` is its role in the catalog and its `weights=` value;
    `safetensors`, `index` (None when it is never sharded) and `dcp_dir` are its names in the model
    directory; `overlays` names the set whose tensors it replaces, under the same names, when a reader
    chooses it (None: it is read as it is); `choosable`: a reader can ask for it with `weights=`;
    `written_by` says what saves it, for the message of a step that lacks it."""

    name: str
    label: str
    safetensors: str
    index: str | None
    dcp_dir: str
    overlays: str | None
    choosable: bool
    written_by: str

    @property
    def files(self) -> str:
        """`ema.safetensors or ema_dcp/`: its names, for a message."""
        return f"{self.safetensors} or {self.dcp_dir}/"


MODEL = WeightSetKind(
    "model", "model", layout.MODEL_SAFETENSORS, layout.MODEL_INDEX, layout.MODEL_DCP_DIR, None, True, "a save"
)
ADAPTER = WeightSetKind(
    "adapter",
    "adapter",
    layout.ADAPTER_SAFETENSORS,
    None,
    layout.ADAPTER_DCP_DIR,
    None,
    False,  # a PEFT step's model: a reader asking for `model` gets it
    "--peft",
)
EMA = WeightSetKind(
    "ema", "EMA", layout.EMA_SAFETENSORS, None, layout.EMA_DCP_DIR, "model", True, "--ema.enable"
)

# In the order a reader prefers them when not told (the catalog lists them in this order too).
WEIGHT_SETS: tuple[WeightSetKind, ...] = (MODEL, ADAPTER, EMA)
CHOICES: tuple[str, ...] = tuple(kind.name for kind in WEIGHT_SETS if kind.choosable)


def choose(weights: str) -> WeightSetKind:
    """The weight set `weights=` names; one line for a name that is none (the CLI's exit 2)."""
    for kind in WEIGHT_SETS:
        if kind.choosable and kind.name == weights:
            return kind
    raise UsageError(f"weights={weights!r} is not one of {', '.join(CHOICES)}", option="--weights")


def extra(name: str) -> WeightSetKind:
    """The weight set a save's or a resume's `extra_weights` key names: one that overlays the model
    (saved beside it, under its names); one line for any other name."""
    for kind in WEIGHT_SETS:
        if kind.overlays is not None and kind.name == name:
            return kind
    names = ", ".join(kind.name for kind in WEIGHT_SETS if kind.overlays is not None)
    raise UsageError(
        f"extra_weights names {name!r}, which is not a weight set saved beside the model ({names})"
    )


def default_choice(present: Collection[str]) -> str:
    """What a reader takes when not told, from the names of the sets a step holds: a set that overlays
    the model when the step has one (a run that kept an EMA kept it to be used, as LeRobot's evaluation
    uses it), else the model."""
    return next((k.name for k in WEIGHT_SETS if k.choosable and k.overlays and k.name in present), MODEL.name)


def missing(path: str, kind: WeightSetKind) -> NotACheckpointError:
    """The one line for a step that does not hold the weight set a reader asked for."""
    return NotACheckpointError(
        f"{path} holds no {kind.label} weights ({kind.files}): it was saved without {kind.written_by};"
        " use its model weights"
    )
