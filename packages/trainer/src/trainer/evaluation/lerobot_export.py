"""`trainer export`: a checkpoint of ours as a model directory LeRobot 0.6.1's `from_pretrained` reads.

Why an export rather than LeRobot's names in every save: a checkpoint's weights are keyed by the
names the trained module has (docs/format.md), and every reader of ours relies on it: resume loads
`model.safetensors` and the optimizer state into the (sharded) module by name, `--policy.path` streams
each rank's blocks by name, the EMA and DCP forms hold the same names, and `ckpt convert` (which
knows no policy) must give the names a safetensors save gives. Our ACT's attention keeps q/k/v apart
(LoRA targets each), where LeRobot's fuses them, so its names cannot be ours; pi0's decoder layers pair
up into the FSDP units that run them, where LeRobot keeps two stacks (and two unused `lm_head`s, written
back here). SmolVLA's and Diffusion Policy's names are LeRobot's already, so exporting them writes the
weights their `pretrained_model/` holds.

Everything LeRobot-specific comes from the policy's adapter (`PolicyConfig.lerobot_adapter`, in its
folder's `lerobot.py`); a policy without one has no LeRobot form and is refused in one line. The
directory holds `config.json` in LeRobot's schema (`config_to_lerobot`), `model.safetensors` under
LeRobot's names and shapes (`state_to_lerobot`), and the processor files in LeRobot's pipeline schema
(`pipeline`), so LeRobot's `make_pre_post_processors(config, pretrained_path=DIR)`
loads them and `trainer.load_policy` and `--policy.path` read the directory too: a checkpoint's files
in that schema already (every ACT, SmolVLA, Diffusion Policy and pi saved since it) are copied byte for byte, older ones
(docs/format.md, `steps-v1`) rewritten in it from the statistics they hold.

A policy trained on a mixture of robots that differ is exported for one of them (`embodiment`, by its
member's name; default the first), as LeRobot's processors hold one robot's statistics: config.json
describes that robot (its state and action sizes, its cameras: `PolicyConfig.for_embodiment`) and the
processor files hold its statistics alone, so LeRobot runs the export on that robot's raw observations.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from safetensors.torch import save_file

import ckpt_tools
from ckpt_tools import layout, storage
from trainer.config.dataset import Embodiment
from trainer.config.policy import LeRobotAdapter, PolicyConfig
from trainer.data.pipeline.processors import Processor
from trainer.data.pipeline.robots import embodiment_tensors
from trainer.errors import ConfigError
from trainer.evaluation.inference import LoadedPolicy, load_policy
from trainer.policies.common import pretrained


def export_lerobot(
    path: str, output_dir: str, weights: str | None = None, embodiment: str | None = None
) -> list[str]:
    """Write the policy saved at `path` (any form `trainer.load_policy` accepts) into the new
    directory `output_dir` in LeRobot's form; returns the names written. `weights`: model or ema
    (default: the EMA when the checkpoint holds one, as `load_policy`); `embodiment`: the robot of a
    policy trained on several (see the module docstring)."""
    if os.path.exists(output_dir) and (not os.path.isdir(output_dir) or os.listdir(output_dir)):
        raise ConfigError(f"--output_dir={output_dir} exists and is not empty: choose a new directory")
    loaded = load_policy(path, "cpu", weights, embodiment=embodiment)
    adapter = lerobot_adapter(loaded.config)
    config = adapter.config_to_lerobot(loaded.config)  # first: a config LeRobot cannot read is refused
    lerobots = adapter.state_to_lerobot(loaded.config, loaded.policy)
    state = {name: tensor.contiguous() for name, tensor in lerobots.items()}
    os.makedirs(output_dir, exist_ok=True)
    with open(os.path.join(output_dir, layout.POLICY_CONFIG), "w", encoding="utf-8") as handle:
        json.dump(config, handle, indent=4)
    save_file(state, os.path.join(output_dir, layout.MODEL_SAFETENSORS), metadata={"format": "pt"})
    if loaded.embodiment is None and _in_lerobots_schema(path):
        return [layout.POLICY_CONFIG, layout.MODEL_SAFETENSORS, *_copy_processors(path, output_dir)]
    return [layout.POLICY_CONFIG, layout.MODEL_SAFETENSORS, *_write_processors(loaded, output_dir, path)]


def lerobot_adapter(config: PolicyConfig) -> LeRobotAdapter[Any]:
    """The policy's LeRobot adapter; a policy without one is one line naming the types that have one
    (read from the registry: no list of types is kept here)."""
    adapter = config.lerobot_adapter()
    if adapter is None:
        exportable = [
            name
            for name in sorted(PolicyConfig.get_known_choices())
            if PolicyConfig.get_choice_class(name).lerobot_adapter() is not None
        ]
        raise ConfigError(
            f"a {config.type} policy has no LeRobot form (its config has no lerobot_adapter), so trainer "
            f"export cannot write it; the policies that export to LeRobot: {', '.join(exportable)}"
        )
    return adapter


def _in_lerobots_schema(path: str) -> bool:
    """Whether the checkpoint's preprocessor is LeRobot's pipeline (its steps have registry names)."""
    try:
        config = ckpt_tools.load_processors(pretrained.resolve(path))[layout.PREPROCESSOR].config
    except ckpt_tools.CheckpointError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    steps = config.get("steps")
    return isinstance(steps, list) and all(isinstance(s, dict) and "registry_name" in s for s in steps)


def _write_processors(loaded: LoadedPolicy, output_dir: str, path: str) -> list[str]:
    """The processors in LeRobot's schema, as the policy's config describes its pipeline: an older
    checkpoint's statistics (read exactly: `steps-v1` holds our mean/std), or one embodiment's as the
    checkpoint saved them (`embodiment_tensors`: read back, LeRobot's mean/std would gain its eps twice)."""
    pipeline = lerobot_adapter(loaded.config).pipeline(loaded.config)
    names = []
    for name, processor in (
        (layout.PREPROCESSOR, loaded.preprocessor),
        (layout.POSTPROCESSOR, loaded.postprocessor),
    ):
        config, tensors = Processor(processor.steps, pipeline).state()
        if loaded.embodiment is not None:
            tensors = _embodiment_state(path, name, loaded.embodiment, tensors)
        names.append(layout.processor_config_name(name))
        with open(os.path.join(output_dir, names[-1]), "w", encoding="utf-8") as handle:
            json.dump(config, handle, indent=2)
        for step, state in zip(config["steps"], tensors, strict=True):
            if "state_file" in step:
                save_file(state, os.path.join(output_dir, step["state_file"]))
                names.append(step["state_file"])
    return names


def _embodiment_state(
    path: str, name: str, embodiment: Embodiment, written: list[dict[str, torch.Tensor]]
) -> list[dict[str, torch.Tensor]]:
    """The checkpoint's own state tensors of `embodiment` for processor `name`, step by step; they must
    be the tensors LeRobot's pipeline for that robot reads (`written`'s names), or the export is refused."""
    try:
        saved = ckpt_tools.load_processors(pretrained.resolve(path))[name]
    except ckpt_tools.CheckpointError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    own = embodiment_tensors(saved.config, saved.step_tensors, embodiment)
    if [sorted(t) for t in own] != [sorted(t) for t in written]:
        raise ConfigError(
            f"{path}: its {name} holds other statistics for embodiment {embodiment.name} than LeRobot's "
            "pipeline for it reads: the processor files were edited or come from another release"
        )
    return own


def _copy_processors(path: str, output_dir: str) -> list[str]:
    """The checkpoint's processor files (`policy_preprocessor*`, `policy_postprocessor*`), byte for byte."""
    try:
        model_dir = ckpt_tools.open_checkpoint(pretrained.resolve(path)).model_dir
        names = sorted(
            name
            for name in storage.list_names(model_dir)
            if name.startswith((layout.PREPROCESSOR, layout.POSTPROCESSOR))
        )
        for name in names:
            data = storage.read_bytes(storage.contained(model_dir, name, "processor file"))
            storage.write_bytes(os.path.join(output_dir, name), data)
    except ckpt_tools.CheckpointError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return names
