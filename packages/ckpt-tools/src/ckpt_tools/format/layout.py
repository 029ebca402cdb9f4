"""Every directory and file name of the on-disk format, in one place.

The trainer never spells a file name itself: it asks this module. `docs/format.md` is the spec;
the names here are its single source of truth.
"""

from __future__ import annotations

import re
from typing import Any

from ckpt_tools.errors import CorruptCheckpointError

CHECKPOINTS_DIR = "checkpoints"
LAST = "last"
BEST = "best"  # the step that scored best by the run's --best_metric (files/scores.py)
POINTERS = (LAST, BEST)
STEP_DIGITS = 6

PRETRAINED_MODEL_DIR = "pretrained_model"
TRAINING_STATE_DIR = "training_state"
MANIFEST = "manifest.json"  # sizes and sha256 of every file the save wrote
EVAL_SCORES = "eval.json"  # a committed step's evaluation scores, written after its commit
EVAL_VIDEOS_DIR = "eval_videos"  # a few of those episodes as mp4 files, beside eval.json

# pretrained_model/
POLICY_CONFIG = "config.json"
TRAIN_CONFIG = "train_config.json"
MODEL_SAFETENSORS = "model.safetensors"
MODEL_INDEX = "model.safetensors.index.json"
MODEL_DCP_DIR = "pytorch_model_fsdp_0"
ADAPTER_SAFETENSORS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_DCP_DIR = "adapter_model_fsdp_0"
EMA_SAFETENSORS = "ema.safetensors"  # the EMA shadow of the trained parameters, gathered
EMA_DCP_DIR = "ema_dcp"  # the same shadow as DCP shards
PREPROCESSOR = "policy_preprocessor"
POSTPROCESSOR = "policy_postprocessor"
MODEL_CARD = "README.md"

# training_state/
TRAINING_STEP = "training_step.json"
RNG_STATE = "rng_state.safetensors"
SCHEDULER_STATE = "scheduler_state.json"
SCALER_STATE = "scaler_state.json"
OPTIMIZER_SAFETENSORS = "optimizer_state.safetensors"
OPTIMIZER_PARAM_GROUPS = "optimizer_param_groups.json"
OPTIMIZER_DCP_DIR = "optimizer_0"

# DCP directories
DCP_METADATA = ".metadata"
DCP_SHARD_SUFFIX = ".distcp"

# A step directory being written carries this prefix until it is complete and renamed.
TMP_PREFIX = ".tmp-"

# ASCII digits only, matched whole: `$` would also accept a trailing newline ("005000\n").
_STEP_NAME = re.compile(rf"[0-9]{{{STEP_DIGITS},}}")


def step_dir_name(step: int) -> str:
    """Zero-padded step name (`005000`), so that a plain sort is a numeric sort."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return f"{step:0{STEP_DIGITS}d}"


def is_step_dir_name(name: str) -> bool:
    return bool(_STEP_NAME.fullmatch(name))


def processor_config_name(processor: str) -> str:
    """`policy_preprocessor.json`."""
    return f"{processor}.json"


def processor_step_name(processor: str, index: int) -> str:
    """`policy_preprocessor_step_0.safetensors`: the tensors of one processor step."""
    return f"{processor}_step_{index}.safetensors"


def lerobot_state_file_name(processor: str, index: int, registry_name: str) -> str:
    """`policy_preprocessor_step_3_normalizer_processor.safetensors`: the state file LeRobot 0.6.1's
    pipeline writer names for step `index` (0-based) of a processor, by the step's registry name."""
    return f"{processor}_step_{index}_{registry_name}.safetensors"


def named_state_files(processor_config: Any, source: str) -> list[str | None] | None:
    """The state file of each step of a processor whose JSON config names them, as LeRobot writes it
    (`{"steps": [{..., "state_file": "policy_preprocessor_step_3_normalizer_processor.safetensors"}]}`):
    one entry per step, None for a step without state. None when no step names a file (our own
    processors: `processor_step_name` for every step). A name that is not a plain `.safetensors` file
    name beside the config (a path, `..`) is refused: it could point outside the checkpoint."""
    steps = processor_config.get("steps") if isinstance(processor_config, dict) else None
    if not isinstance(steps, list) or not any(isinstance(s, dict) and "state_file" in s for s in steps):
        return None
    names: list[str | None] = []
    for step in steps:
        name = step.get("state_file") if isinstance(step, dict) else None
        if name is not None and (
            not isinstance(name, str) or not _PLAIN_FILE.match(name) or not name.endswith(".safetensors")
        ):
            raise CorruptCheckpointError(
                f"{source}: state_file {name!r} is not a .safetensors file name beside the config; "
                "the processor config is damaged or crafted"
            )
        names.append(name)
    return names


_PLAIN_FILE = re.compile(r"^(?!\.\.?$)[^/\\]+$")


def export_dir_name(dtype: str) -> str:
    """`export-bf16`: where `ckpt convert --dtype bf16` puts its lower-precision copy in a step."""
    return f"export-{dtype}"


def sharded_model_name(index: int, total: int) -> str:
    """`model-00001-of-00003.safetensors`, the name transformers and huggingface_hub expect."""
    return f"model-{index:05d}-of-{total:05d}.safetensors"


def join(*parts: str) -> str:
    """Join path parts with '/', valid for local paths and fsspec URLs alike."""
    head, *rest = parts
    out = head.rstrip("/")
    for part in rest:
        out = f"{out}/{part.strip('/')}"
    return out


def parent(path: str) -> str:
    """The directory holding `path` (a local path or an fsspec URL, '/'-separated, trailing slashes
    ignored): `a/b/c` -> `a/b`, `/x` -> `/`, a bare name -> `.`."""
    head, sep, _ = path.rstrip("/").rpartition("/")
    if not sep:
        return "."
    return head or "/"


def name(path: str) -> str:
    """The last component of `path`, trailing slashes ignored: `a/b/` -> `b`."""
    return path.rstrip("/").rpartition("/")[2]


def is_url(text: str) -> bool:
    """Whether `text` names an fsspec URL (`s3://bucket/run`) rather than a local path."""
    return "://" in text
