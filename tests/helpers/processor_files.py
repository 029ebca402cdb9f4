"""Our processor files held against those lerobot-train wrote for the same policy and dataset."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors import safe_open

from trainer.data.pipeline.lerobot_schema import RANGES

NEEDED = {"MEAN_STD": ("mean", "std"), **RANGES, "IDENTITY": ()}  # the statistics each mode reads


def headers(path: Path) -> dict[str, tuple[str, list[int]]]:
    with safe_open(str(path), "pt") as handle:
        return {k: (handle.get_slice(k).get_dtype(), handle.get_slice(k).get_shape()) for k in handle.keys()}  # noqa: SIM118


def same_as_lerobots(ours: Path, theirs: Path, backbone: Path | None = None) -> None:
    """Every processor JSON equal; each state file named as LeRobot's, holding the tensors LeRobot's
    step reads for its features' modes (of its shapes and dtypes) and no tensor LeRobot's file lacks.
    `backbone`: the local SmolVLM directory our run was given as `tiny_smolvlm`, relative, as LeRobot's
    run was: LeRobot's tokenizer step names it so, ours by its absolute path (any directory reads it)."""
    for name in ("policy_preprocessor.json", "policy_postprocessor.json"):
        config, lerobots = json.loads((ours / name).read_text()), json.loads((theirs / name).read_text())
        for step in lerobots["steps"] if backbone is not None else ():
            if step["config"].get("tokenizer_name") == backbone.name:
                step["config"]["tokenizer_name"] = str(backbone)
        assert config == lerobots, name
        for step in config["steps"]:
            if "state_file" not in step:
                continue
            mine, lerobots = headers(ours / step["state_file"]), headers(theirs / step["state_file"])
            features, norm_map = step["config"]["features"], step["config"]["norm_map"]
            needed = {
                f"{key}.{stat}"
                for key, feature in features.items()
                for stat in NEEDED[norm_map.get(feature["type"], "IDENTITY")]
            }
            assert needed and needed <= mine.keys() <= lerobots.keys(), (step["state_file"], sorted(mine))
            assert {key: lerobots[key] for key in mine} == mine


def read_processors(directory: Path) -> list:
    """(pre-, postprocessor) a checkpoint directory saved (ours or LeRobot's), as the engine reads them."""
    import ckpt_tools
    from trainer.data.pipeline.processors import Processor

    saved = ckpt_tools.load_processors(str(directory))
    return [
        Processor.from_state(saved[name].config, saved[name].step_tensors)
        for name in ("policy_preprocessor", "policy_postprocessor")
    ]
