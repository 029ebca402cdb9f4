"""ckpt-tools: the checkpoint format of multi-GPU PyTorch training, as a library.

`import ckpt_tools` stays cheap (no torch import): public names load lazily on first use, so metadata
commands answer in well under a second.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "CheckpointError": "ckpt_tools.errors",
    "CorruptCheckpointError": "ckpt_tools.errors",
    "LegacyCheckpointError": "ckpt_tools.errors",
    "UnsupportedVersionError": "ckpt_tools.errors",
    "dtype_name": "ckpt_tools.dtypes",
    "TrainingStep": "ckpt_tools.meta",
    "Topology": "ckpt_tools.meta",
    "SamplerPosition": "ckpt_tools.meta",
    "ProcessorState": "ckpt_tools.processors",
    "save_checkpoint": "ckpt_tools.save",
    "start_checkpoint": "ckpt_tools.save",
    "PendingCheckpoint": "ckpt_tools.save",
    "prepare_save_groups": "ckpt_tools.save",
    "load_training_state": "ckpt_tools.load",
    "save_rng_state": "ckpt_tools.rng",
    "load_rng_state": "ckpt_tools.rng",
    "read_training_step": "ckpt_tools.locate",
    "latest_step_dir": "ckpt_tools.commit",
    "Checkpoint": "ckpt_tools.loading",
    "open_checkpoint": "ckpt_tools.loading",
    "load_model_state_dict": "ckpt_tools.loading",
    "load_processors": "ckpt_tools.processors",
    "RunShape": "ckpt_tools.resume",
    "ResumePlan": "ckpt_tools.resume",
    "plan_resume": "ckpt_tools.resume",
    "ResumeRefusedError": "ckpt_tools.errors",
    "SaveFailedError": "ckpt_tools.errors",
    "merge_lora": "ckpt_tools.adapters",
    "merge_adapter_dir": "ckpt_tools.adapters",
    "PublishError": "ckpt_tools.errors",
    "PublishResult": "ckpt_tools.publish",
    "publish_model": "ckpt_tools.publish",
    "select_publish_files": "ckpt_tools.publish",
    "is_fsspec_target": "ckpt_tools.publish",
    "ConversionResult": "ckpt_tools.convert",
    "convert_dcp_to_safetensors": "ckpt_tools.convert",
    "convert_safetensors_to_dcp": "ckpt_tools.convert",
    "CheckpointDescription": "ckpt_tools.inspect",
    "describe_checkpoint": "ckpt_tools.inspect",
    "VerifyReport": "ckpt_tools.verify",
    "verify_checkpoint": "ckpt_tools.verify",
}

# public modules: `layout` holds every directory and file name of the format (torch-free constants)
_MODULES = ("layout",)

__all__ = sorted([*_EXPORTS, *_MODULES])


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return importlib.import_module(f"ckpt_tools.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ckpt_tools' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return __all__
