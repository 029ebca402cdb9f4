"""ckpt-tools: the checkpoint format of multi-GPU PyTorch training, as a library.

An evaluation pipeline opens what any run wrote (one process or many, FSDP2, HSDP or DDP; safetensors
or DCP shards; a local path or an fsspec URL), builds its model from the saved config, loads the
weights on CPU, with no process group, and runs it:

```python
import torch
from torch import nn

import ckpt_tools

path = "outputs/run/checkpoints/last"  # a step directory, `last`, a pretrained_model/ or a URL
checkpoint = ckpt_tools.open_checkpoint(path)
config = checkpoint.policy_config()  # the config.json saved beside the weights
model = nn.Sequential(  # your model class, built from its config
    nn.Linear(config["obs_dim"], config["hidden"]), nn.ReLU(), nn.Linear(config["hidden"], config["action_dim"])
)
weights = checkpoint.default_weights  # "ema" when the run kept an EMA, else "model"
model.load_state_dict(ckpt_tools.load_model_state_dict(path, weights=weights))
with torch.no_grad():
    action = model.eval()(torch.zeros(1, config["obs_dim"]))
print(f"step {checkpoint.training_step().step} ({weights} weights): {action.tolist()}")
```

`load_processors(path)` gives the policy's normalization state saved with it;
`describe_checkpoint` and `verify_checkpoint` report on a checkpoint without loading its tensors.
`tests/ckpt/test_api_example.py` runs this example.

`import ckpt_tools` stays cheap (no torch import): public names load lazily on first use, so metadata
commands answer in well under a second. Type checkers and editors read the `TYPE_CHECKING` imports
below instead, so every public name has its real type; `tests/ckpt/test_exported_members.py` keeps
those imports, the lazy table and `__all__` the same list.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ckpt_tools._version import __version__ as __version__

# What mypy and editors read: the real types, never imported at run time. Each name is re-exported
# explicitly (`name as name`), one `from` line per module (so isort is off: it would split them).
# isort: off
if TYPE_CHECKING:
    from ckpt_tools.errors import (
        CheckpointError as CheckpointError,
        CorruptCheckpointError as CorruptCheckpointError,
        LegacyCheckpointError as LegacyCheckpointError,
        PublishError as PublishError,
        ResumeRefusedError as ResumeRefusedError,
        SaveFailedError as SaveFailedError,
        UnsupportedVersionError as UnsupportedVersionError,
        UsageError as UsageError,
        one_line as one_line,
    )
    from ckpt_tools.files import storage as storage
    from ckpt_tools.files.commit import latest_step_dir as latest_step_dir, prune_steps as prune_steps
    from ckpt_tools.files.locate import read_training_step as read_training_step
    from ckpt_tools.files.scores import (
        Ranking as Ranking,
        best_steps as best_steps,
        default_mode as default_mode,
        point_best as point_best,
        read_scores as read_scores,
        write_scores as write_scores,
    )
    from ckpt_tools.files.sharded_safetensors import parse_size as parse_size
    from ckpt_tools.files.storage import read_config_json as read_config_json
    from ckpt_tools.format import layout as layout
    from ckpt_tools.format.dtypes import dtype_name as dtype_name
    from ckpt_tools.format.meta import (
        CheckpointFormat as CheckpointFormat,
        SamplerPosition as SamplerPosition,
        Topology as Topology,
        TrainingStep as TrainingStep,
    )
    from ckpt_tools.reports.describe import (
        CheckpointDescription as CheckpointDescription,
        describe_checkpoint as describe_checkpoint,
    )
    from ckpt_tools.reports.verify import VerifyReport as VerifyReport, verify_checkpoint as verify_checkpoint
    from ckpt_tools.state.adapters import merge_adapter_dir as merge_adapter_dir, merge_lora as merge_lora
    from ckpt_tools.state.collective import main_decides as main_decides
    from ckpt_tools.state.evaluation_load import (
        Checkpoint as Checkpoint,
        load_model_state_dict as load_model_state_dict,
        open_checkpoint as open_checkpoint,
    )
    from ckpt_tools.state.processor_state import (
        ProcessorState as ProcessorState,
        load_processors as load_processors,
    )
    from ckpt_tools.state.resume_plan import (
        ResumePlan as ResumePlan,
        RunShape as RunShape,
        plan_resume as plan_resume,
    )
    from ckpt_tools.state.rng import load_rng_state as load_rng_state, save_rng_state as save_rng_state
    from ckpt_tools.state.save import (
        PendingCheckpoint as PendingCheckpoint,
        prepare_save_groups as prepare_save_groups,
        save_checkpoint as save_checkpoint,
        start_checkpoint as start_checkpoint,
    )
    from ckpt_tools.state.lerobot_load import (
        check_lerobot_resumable as check_lerobot_resumable,
        is_lerobot_checkpoint as is_lerobot_checkpoint,
        load_lerobot_rng_state as load_lerobot_rng_state,
        load_lerobot_training_state as load_lerobot_training_state,
        read_lerobot_training_step as read_lerobot_training_step,
    )
    from ckpt_tools.state.training_load import load_training_state as load_training_state
    from ckpt_tools.state.training_load import load_model_weights as load_model_weights
    from ckpt_tools.tools.convert.result import ConversionResult as ConversionResult
    from ckpt_tools.tools.convert.to_dcp import convert_safetensors_to_dcp as convert_safetensors_to_dcp
    from ckpt_tools.tools.convert.to_safetensors import (
        convert_dcp_to_safetensors as convert_dcp_to_safetensors,
    )
    from ckpt_tools.tools.publish import (
        PublishResult as PublishResult,
        is_fsspec_target as is_fsspec_target,
        publish_model as publish_model,
        select_publish_files as select_publish_files,
    )
# isort: on

# public name -> the module that defines it (mypy --strict checks these modules: noxfile.py typecheck)
_EXPORTS: dict[str, str] = {
    "CheckpointError": "ckpt_tools.errors",
    "CorruptCheckpointError": "ckpt_tools.errors",
    "LegacyCheckpointError": "ckpt_tools.errors",
    "UnsupportedVersionError": "ckpt_tools.errors",
    "dtype_name": "ckpt_tools.format.dtypes",
    "read_config_json": "ckpt_tools.files.storage",
    "parse_size": "ckpt_tools.files.sharded_safetensors",
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
    "is_lerobot_checkpoint": "ckpt_tools.state.lerobot_load",
    "check_lerobot_resumable": "ckpt_tools.state.lerobot_load",
    "read_lerobot_training_step": "ckpt_tools.state.lerobot_load",
    "load_lerobot_rng_state": "ckpt_tools.state.lerobot_load",
    "load_lerobot_training_state": "ckpt_tools.state.lerobot_load",
    "load_model_weights": "ckpt_tools.state.training_load",
    "save_rng_state": "ckpt_tools.state.rng",
    "load_rng_state": "ckpt_tools.state.rng",
    "read_training_step": "ckpt_tools.files.locate",
    "latest_step_dir": "ckpt_tools.files.commit",
    "prune_steps": "ckpt_tools.files.commit",
    "Ranking": "ckpt_tools.files.scores",
    "best_steps": "ckpt_tools.files.scores",
    "default_mode": "ckpt_tools.files.scores",
    "point_best": "ckpt_tools.files.scores",
    "read_scores": "ckpt_tools.files.scores",
    "write_scores": "ckpt_tools.files.scores",
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
    "ConversionResult": "ckpt_tools.tools.convert.result",
    "convert_dcp_to_safetensors": "ckpt_tools.tools.convert.to_safetensors",
    "convert_safetensors_to_dcp": "ckpt_tools.tools.convert.to_dcp",
    "CheckpointDescription": "ckpt_tools.reports.describe",
    "describe_checkpoint": "ckpt_tools.reports.describe",
    "VerifyReport": "ckpt_tools.reports.verify",
    "verify_checkpoint": "ckpt_tools.reports.verify",
}

# public modules: `layout` holds every directory and file name of the format (torch-free constants);
# `storage` reads and writes files on local disk or any fsspec store, as the checkpoints do
_MODULES: dict[str, str] = {"layout": "ckpt_tools.format.layout", "storage": "ckpt_tools.files.storage"}

__all__ = sorted([*_EXPORTS, *_MODULES])


if not TYPE_CHECKING:  # to a type checker, a module __getattr__ would make every misspelt name `Any`

    def __getattr__(name: str) -> object:
        module = _MODULES.get(name) or _EXPORTS.get(name)
        if module is None:
            raise AttributeError(f"module 'ckpt_tools' has no attribute {name!r}")
        imported = importlib.import_module(module)
        value = imported if name in _MODULES else getattr(imported, name)
        globals()[name] = value  # found directly from now on (pdoc reads the module's __dict__)
        return value


def __dir__() -> list[str]:
    return __all__
