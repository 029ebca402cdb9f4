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
    "dtype_name": "ckpt_tools.format.dtypes",
    "read_config_json": "ckpt_tools.files.storage",
    "TrainingStep": "ckpt_tools.format.meta",
    "Topology": "ckpt_tools.format.meta",
    "SamplerPosition": "ckpt_tools.format.meta",
    "CheckpointFormat": "ckpt_tools.format.meta",
    "ProcessorState": "ckpt_tools.state.processor_state",
    "save_checkpoint": "ckpt_tools.state.save",
    "start_checkpoint": "ckpt_tools.state.save",
    "PendingCheckpoint": "ckpt_tools.state.save",
    "prepare_save_groups": "ckpt_tools.state.save",
    "load_training_state": "ckpt_tools.state.training_load",
    "load_model_weights": "ckpt_tools.state.training_load",
    "save_rng_state": "ckpt_tools.state.rng",
    "load_rng_state": "ckpt_tools.state.rng",
    "read_training_step": "ckpt_tools.files.locate",
    "latest_step_dir": "ckpt_tools.files.commit",
    "Checkpoint": "ckpt_tools.state.evaluation_load",
    "open_checkpoint": "ckpt_tools.state.evaluation_load",
    "load_model_state_dict": "ckpt_tools.state.evaluation_load",
    "load_processors": "ckpt_tools.state.processor_state",
    "RunShape": "ckpt_tools.state.resume_plan",
    "ResumePlan": "ckpt_tools.state.resume_plan",
    "plan_resume": "ckpt_tools.state.resume_plan",
    "ResumeRefusedError": "ckpt_tools.errors",
    "SaveFailedError": "ckpt_tools.errors",
    "UsageError": "ckpt_tools.errors",
    "one_line": "ckpt_tools.errors",
    "main_decides": "ckpt_tools.state.collective",
    "merge_lora": "ckpt_tools.state.adapters",
    "merge_adapter_dir": "ckpt_tools.state.adapters",
    "PublishError": "ckpt_tools.errors",
    "PublishResult": "ckpt_tools.tools.publish",
    "publish_model": "ckpt_tools.tools.publish",
    "select_publish_files": "ckpt_tools.tools.publish",
    "is_fsspec_target": "ckpt_tools.tools.publish",
    "ConversionResult": "ckpt_tools.tools.convert",
    "convert_dcp_to_safetensors": "ckpt_tools.tools.convert",
    "convert_safetensors_to_dcp": "ckpt_tools.tools.convert",
    "CheckpointDescription": "ckpt_tools.reports.describe",
    "describe_checkpoint": "ckpt_tools.reports.describe",
    "VerifyReport": "ckpt_tools.reports.verify",
    "verify_checkpoint": "ckpt_tools.reports.verify",
}

# public modules: `layout` holds every directory and file name of the format (torch-free constants);
# `storage` reads and writes files on local disk or any fsspec store, as the checkpoints do
_MODULES: dict[str, str] = {"layout": "ckpt_tools.format.layout", "storage": "ckpt_tools.files.storage"}

__all__ = sorted([*_EXPORTS, *_MODULES])


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return importlib.import_module(_MODULES[name])
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ckpt_tools' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return __all__
