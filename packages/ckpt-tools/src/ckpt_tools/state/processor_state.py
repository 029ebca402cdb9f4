"""The policy's pre/post-processors saved beside the weights: a JSON config and the steps' tensor files,
either named by the config (LeRobot 0.6.1's pipeline schema: a step's `state_file`, only for steps
with state) or numbered (`<name>_step_<i>.safetensors` for every step: the schema before it)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ckpt_tools.errors import UsageError
from ckpt_tools.files import manifest, storage
from ckpt_tools.files.digest import Recorder
from ckpt_tools.files.locate import resolve_model_dir
from ckpt_tools.format import layout
from ckpt_tools.tensors.tensor_io import read_safetensors, write_safetensors


@dataclass
class ProcessorState:
    """A pre/post-processor of the policy: its JSON config and one tensor dict per processor step.

    Saved as `<name>.json` plus, when the config's steps name their `state_file`s (LeRobot's schema),
    those files for the steps naming one (a step without one must hold no tensors); otherwise
    `<name>_step_<i>.safetensors` for every step, an empty file included, so step indices stay dense.
    Names are `layout.PREPROCESSOR` and `layout.POSTPROCESSOR`.
    """

    config: dict[str, Any]
    step_tensors: list[dict[str, torch.Tensor]]


def check_processors(processors: Mapping[str, ProcessorState] | None) -> None:
    """Refuse an unknown processor name before the first byte is written."""
    for name in processors or {}:
        if name not in (layout.PREPROCESSOR, layout.POSTPROCESSOR):
            raise UsageError(
                f"processor {name!r} is not one of {layout.PREPROCESSOR!r}, {layout.POSTPROCESSOR!r}; "
                "use the names in ckpt_tools.format.layout"
            )


def write_processors(
    model_dir: str, processors: Mapping[str, ProcessorState] | None, recorder: Recorder | None = None
) -> None:
    """Write every processor's config and step files into `model_dir` (main rank only)."""
    for name, processor in (processors or {}).items():
        files = _step_files(name, processor)  # a mismatch refused before this processor's first byte
        manifest.write_json(
            layout.join(model_dir, layout.processor_config_name(name)), processor.config, recorder
        )
        for file, tensors in files:
            write_safetensors(layout.join(model_dir, file), tensors, None, recorder)


def _step_files(name: str, processor: ProcessorState) -> list[tuple[str, dict[str, torch.Tensor]]]:
    """(file name, tensors) of each step that is written: the config's `state_file`s, else numbered."""
    named = layout.named_state_files(processor.config, layout.processor_config_name(name))
    if named is None:
        return [(layout.processor_step_name(name, i), t) for i, t in enumerate(processor.step_tensors)]
    if len(named) != len(processor.step_tensors) or any(
        tensors and not file for file, tensors in zip(named, processor.step_tensors, strict=False)
    ):
        raise UsageError(
            f"processor {name!r} names state files for {len(named)} steps but holds tensors for "
            f"{len(processor.step_tensors)}, or tensors for a step without a state_file: give one dict per step"
        )
    return [(file, tensors) for file, tensors in zip(named, processor.step_tensors, strict=True) if file]


def load_processors(path: str | os.PathLike[str]) -> dict[str, ProcessorState]:
    """The policy's pre/post-processors saved with the checkpoint, by name (absent ones left out).
    A config naming its steps' state files (LeRobot's) is read by those names; a named file that is
    missing raises `CheckpointNotFoundError` rather than being dropped."""
    _, model_dir = resolve_model_dir(path)
    found = {}
    for name in (layout.PREPROCESSOR, layout.POSTPROCESSOR):
        config_path = layout.join(model_dir, layout.processor_config_name(name))
        if not storage.exists(config_path):
            continue
        config = storage.read_json_object(config_path)
        found[name] = ProcessorState(
            config=config, step_tensors=_step_tensors(model_dir, name, config, config_path)
        )
    return found


def _step_tensors(
    model_dir: str, name: str, config: dict[str, Any], config_path: str
) -> list[dict[str, torch.Tensor]]:
    """One tensor dict per processor step: from the files the config names (LeRobot's `state_file`,
    empty for a step without one), else our numbered `<name>_step_<i>.safetensors`."""
    named = layout.named_state_files(config, config_path)
    if named is not None:
        return [read_safetensors(layout.join(model_dir, file))[0] if file else {} for file in named]
    steps: list[dict[str, torch.Tensor]] = []
    while storage.exists(step_path := layout.join(model_dir, layout.processor_step_name(name, len(steps)))):
        steps.append(read_safetensors(step_path)[0])
    return steps
