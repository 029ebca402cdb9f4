"""LoRA adapters as files: merge an adapter into its base weights without peft.

peft saves an adapter as `adapter_model.safetensors` whose keys are the PEFT model's names
(`base_model.model.<module>.lora_A.weight`, `...lora_B.weight`, and full copies of
`modules_to_save` as `base_model.model.<module>.weight`) plus `adapter_config.json`. Merging is
`W += scale * B @ A` per adapted module, with `scale = alpha / r` (`alpha / sqrt(r)` for rsLoRA), so an
evaluation machine needs neither peft nor the training code to get a plain `model.safetensors`.
The config's merge fields are checked first (`adapter_config.adapter_config_problems`).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ckpt_tools.errors import CheckpointError
from ckpt_tools.files import storage
from ckpt_tools.files.locate import resolve_model_dir
from ckpt_tools.format import layout
from ckpt_tools.format.adapter_config import adapter_config_problems, pattern_regex
from ckpt_tools.state.evaluation_load import load_model_state_dict

PEFT_PREFIX = "base_model.model."
ADAPTER_NAME = "default"  # the adapter peft creates when none is named; dropped from saved keys
_LORA_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<which>[AB])\.weight$")
_UNSUPPORTED = {"use_dora": "DoRA", "lora_bias": "LoRA bias", "use_qalora": "QA-LoRA"}


def peft_key(name: str, adapter_name: str = ADAPTER_NAME) -> str:
    """The key peft saves a trainable parameter under (what `peft.get_peft_model_state_dict` returns).

    The adapter name is dropped after a `lora_*` segment (`q.lora_A.default.weight` -> `q.lora_A.weight`),
    and a full-training copy is saved under its module's own name (`head.modules_to_save.default.weight`
    -> `head.weight`), so an adapter file reads the same whatever the adapter was called in training.
    """
    parts = name.split(".")
    out: list[str] = []
    for index, part in enumerate(parts):
        previous = parts[index - 1] if index else ""
        if part == adapter_name and (previous.startswith("lora_") or previous == "modules_to_save"):
            continue
        if part == "modules_to_save" and parts[index + 1 : index + 2] == [adapter_name]:
            continue
        out.append(part)
    return ".".join(out)


def adapter_keys(model: nn.Module) -> dict[str, str]:
    """Trainable parameter name -> the key its tensor has in an adapter file (peft's naming)."""
    return {name: peft_key(name) for name, param in model.named_parameters() if param.requires_grad}


def merge_lora(
    base: Mapping[str, torch.Tensor], adapter: Mapping[str, torch.Tensor], config: Mapping[str, Any]
) -> dict[str, torch.Tensor]:
    """Return a new state dict: `base` with the adapter folded in. Inputs are left untouched.

    The arithmetic runs in fp32 and the result takes each base tensor's dtype.
    """
    _check_config(config)
    merged = dict(base)
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in adapter.items():
        name = key.removeprefix(PEFT_PREFIX)
        match = _LORA_KEY.match(name)
        if match:
            pairs.setdefault(match["module"], {})[match["which"]] = tensor
        else:
            _require(base, name, key)
            merged[name] = tensor.to(base[name].dtype).clone()
    for module, lora in sorted(pairs.items()):
        merged[f"{module}.weight"] = _merged_weight(base, module, lora, config)
    return merged


def _merged_weight(
    base: Mapping[str, torch.Tensor], module: str, lora: dict[str, torch.Tensor], config: Mapping[str, Any]
) -> torch.Tensor:
    if set(lora) != {"A", "B"}:
        missing = "lora_B" if "A" in lora else "lora_A"
        raise CheckpointError(
            f"adapter for {module!r} has no {missing} weight; the adapter file is incomplete"
        )
    weight_key = f"{module}.weight"
    _require(base, weight_key, f"{module}.lora_A.weight")
    weight = base[weight_key]
    delta = lora["B"].float() @ lora["A"].float()
    if config.get("fan_in_fan_out"):
        delta = delta.T
    if delta.shape != weight.shape:
        raise CheckpointError(
            f"adapter for {module!r} has shape {tuple(delta.shape)} but the base weight is "
            f"{tuple(weight.shape)}; this adapter was trained on another base model"
        )
    return (weight.float() + _scale(module, lora["A"].shape[0], config) * delta).to(weight.dtype)


def _scale(module: str, rank: int, config: Mapping[str, Any]) -> float:
    if rank <= 0:
        raise CheckpointError(
            f"adapter for {module!r} has rank 0 (lora_A has no rows); the adapter is damaged"
        )
    alpha = _pattern_value(module, config.get("alpha_pattern") or {}, config.get("lora_alpha", 8))
    rank = _pattern_value(module, config.get("rank_pattern") or {}, rank)
    return float(alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank)


def _pattern_value(module: str, patterns: Mapping[str, Any], default: Any) -> Any:
    # peft matches these keys as regexes against the end of the module name.
    for pattern, value in patterns.items():
        if re.match(pattern_regex(pattern), module):
            return value
    return default


def _check_config(config: Mapping[str, Any]) -> None:
    problems = adapter_config_problems(config)
    if problems:
        raise CheckpointError(f"cannot merge: {problems[0]}")
    peft_type = str(config.get("peft_type", "LORA")).upper().removeprefix("PEFTTYPE.")
    if peft_type != "LORA":
        raise CheckpointError(
            f"cannot merge a {peft_type} adapter: only LoRA adapters merge into base weights"
        )
    for key, name in _UNSUPPORTED.items():
        if config.get(key):
            raise CheckpointError(
                f"cannot merge a {name} adapter ({key}=true) yet; load it with peft instead"
            )


def _require(base: Mapping[str, torch.Tensor], name: str, adapter_key: str) -> None:
    if name not in base:
        raise CheckpointError(
            f"adapter key {adapter_key!r} targets {name!r}, which the base model does not have; "
            "check that the adapter belongs to this base model"
        )


def merge_adapter_dir(
    base_path: str | os.PathLike[str], adapter_path: str | os.PathLike[str], *, weights: str = "model"
) -> dict[str, torch.Tensor]:
    """Load a base model and an adapter checkpoint (any format ckpt-tools reads, the adapter's DCP
    shards included), return merged weights: what an evaluation pipeline loads into a plain policy.
    `weights="ema"` merges the EMA of the adapter instead (`load_model_state_dict`)."""
    _, adapter_dir = resolve_model_dir(adapter_path)
    config = storage.read_json_object(layout.join(adapter_dir, layout.ADAPTER_CONFIG))
    adapter = load_model_state_dict(adapter_dir, weights=weights)
    return merge_lora(load_model_state_dict(base_path), adapter, config)


def base_model_path(adapter_path: str | os.PathLike[str]) -> str | None:
    """The base model an adapter was trained on, as recorded in its `adapter_config.json`."""
    _, adapter_dir = resolve_model_dir(adapter_path)
    base = storage.read_json_object(layout.join(adapter_dir, layout.ADAPTER_CONFIG)).get(
        "base_model_name_or_path"
    )
    return base if isinstance(base, str) and base else None
