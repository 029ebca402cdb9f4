"""PEFT fine-tuning: the policy a run trains, its adapter config, and the checks that keep FSDP2 happy.

`start_policy` loads `--policy.path` weights into the freshly built policy and, with `--peft.method_type`,
wraps it with peft (`wrap_policy`): the base is frozen, the adapters (and `--peft.full_training_modules`
copies) train. A meta build (engine/build.py) wraps its meta policy with `wrap_policy` alone, initializes
the adapters with `AdapterInitializer` and streams the base's weights under `base_weight_names`.
Everything else runs unchanged on the PEFT model: its module names gain a `base_model.model.` prefix,
the policy's wrap classes and `_fsdp_forward_methods` are still found through it, so the frozen base is
sharded together with the adapters.

Dtypes: peft keeps adapters in fp32 over a bf16/fp16 base, while full-training copies keep the base
dtype. FSDP2 requires one dtype for the trainable parameters of a unit, so with mixed precision on every
trainable parameter is upcast to fp32 (the frozen base keeps its dtype; the mixed-precision policy casts
for compute). Without mixed precision the one combination that cannot work is refused at start.
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from ckpt_tools import layout
from trainer.config.sections import PolicySection
from trainer.errors import ConfigError
from trainer.policies.common import pretrained
from trainer.policies.common.base import Policy, policy_of

if TYPE_CHECKING:
    from peft import PeftModel

ADAPTER = "default"  # peft's adapter name when none is given
PEFT_PREFIX = "base_model.model."
_OPTIONAL_PREFIX = r"(?:base_model\.model\.)?"


def start_policy(policy: nn.Module, section: PolicySection, is_sharded: bool) -> nn.Module:
    """The module the run trains: `--policy.path` weights loaded (else the policy's own pretrained
    parts, ACT's camera trunk), then LoRA applied with `--peft.*`.

    Call on every rank before the wrap plan, the optimizer and `prepare()`.
    """
    if section.policy.path is not None:
        pretrained.load_weights(policy, section.policy.path)
    elif isinstance(policy, Policy):
        policy.load_pretrained_parts()
    return wrap_policy(policy, section, is_sharded)


def wrap_policy(policy: nn.Module, section: PolicySection, is_sharded: bool) -> nn.Module:
    """The policy with LoRA applied with `--peft.*` (the policy itself without): a real policy whose
    weights are loaded, or a meta-built one (and its twin, engine/build.py) whose weights come later."""
    if not section.peft.enabled:
        return policy
    _check_dtypes(policy, section, is_sharded)
    model = _wrap(policy, section)
    if _mixed_precision(section):
        for param in model.parameters():
            if param.requires_grad and param.dtype != torch.float32:
                param.data = param.data.float()
    if is_sharded:
        _check_ignored_modules(model, section)
    return model


def adapter_config(model: torch.nn.Module, base_model: str | None) -> dict[str, Any] | None:
    """`adapter_config.json` of a PEFT model (peft's own fields, `base_model` recorded as the base it
    was trained from, --policy.path); None for a model without adapters."""
    if getattr(model, "peft_config", None) is None:
        return None
    data = cast("PeftModel", model).peft_config[ADAPTER].to_dict()
    data["base_model_name_or_path"] = _base_reference(base_model)
    return json.loads(json.dumps(data, default=_jsonable))


def saved_weight_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """Names and shapes the model's checkpoint holds: the adapter (peft's keys) on a PEFT model."""
    if getattr(model, "peft_config", None) is None:
        return {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    from peft import get_peft_model_state_dict

    return {name: tuple(tensor.shape) for name, tensor in get_peft_model_state_dict(model).items()}


class AdapterInitializer:
    """How a module of a meta-built PEFT model is initialized (engine/build.py's `Initializer`): each
    LoRA pair as peft's default `init_lora_weights=True` draws it (`LoraLayer.reset_lora_parameters`:
    A kaiming-uniform with a=sqrt(5), B zeros, so the adapted policy starts as its base), every other
    module by the base policy's own rule. `model` is the wrapped module whose modules it is given."""

    def __init__(self, model: nn.Module, policy: Policy) -> None:
        from peft.tuners.lora import LoraLayer

        layers = [layer for layer in model.modules() if isinstance(layer, LoraLayer)]
        self._a = {id(m) for layer in layers for m in layer.lora_A.values()}
        self._b = {id(m) for layer in layers for m in layer.lora_B.values()}
        self._policy = policy

    def initializes(self, module: nn.Module) -> bool:
        return id(module) in self._a or id(module) in self._b or self._policy.initializes(module)

    def initialize_module(self, module: nn.Module) -> None:
        if id(module) in self._a:
            nn.init.kaiming_uniform_(module.weight, a=math.sqrt(5))  # type: ignore[arg-type]
        elif id(module) in self._b:
            for param in module.parameters(recurse=False):
                nn.init.zeros_(param)
        else:
            self._policy.initialize_module(module)


def base_weight_names(model: nn.Module) -> dict[str, str]:
    """A PEFT model's frozen base tensors by their names in it -> the names the base policy saved
    them under (`base_model.model.q.base_layer.weight` -> `q.weight`), for `--policy.path` weights
    streamed into a meta-built PEFT model (the adapters keep their initialization)."""
    names = {}
    for name in model.state_dict():
        parts = name.removeprefix(PEFT_PREFIX).split(".")
        if not any(part.startswith("lora_") for part in parts):
            names[name] = ".".join(part for part in parts if part != "base_layer")
    return names


def _wrap(policy: nn.Module, section: PolicySection) -> nn.Module:
    from peft import get_peft_model

    declared = policy_of(policy)
    targets = list(section.peft.target_modules or ()) or list(
        declared.peft_target_modules() if declared else ()
    )
    if not targets:
        raise ConfigError(
            f"{type(policy).__name__} declares no peft_target_modules: set --peft.target_modules=[name,...] "
            f"(its linear layers: {', '.join(_linear_names(policy)[:8])})"
        )
    for name in section.peft.full_training_modules or ():
        if not any(m == name or m.endswith("." + name) for m, _ in policy.named_modules()):
            raise ConfigError(
                f"--peft.full_training_modules names {name!r}, which {type(policy).__name__} does not have "
                f"(its modules include {', '.join(_linear_names(policy)[:8])})"
            )
    try:
        return get_peft_model(policy, section.peft.build(targets))
    except ValueError as exc:  # peft: "Target modules {...} not found in the base model"
        raise ConfigError(
            f"--peft.target_modules={targets} does not fit {type(policy).__name__} ({' '.join(str(exc).split())[:160]}); "
            f"its linear layers: {', '.join(_linear_names(policy)[:8])}"
        ) from None


def _linear_names(policy: nn.Module) -> list[str]:
    return [name for name, module in policy.named_modules() if isinstance(module, nn.Linear)]


def _mixed_precision(section: PolicySection) -> bool:
    units = section.units
    return units.mixed_precision != "no" or units.fsdp.mixed_precision_policy.is_set


def _check_dtypes(policy: nn.Module, section: PolicySection, is_sharded: bool) -> None:
    """Refuse the combination FSDP2 cannot shard: trainable fp32 adapters next to low-precision
    full-training copies in one unit, which only happens without mixed precision."""
    base_dtype = next(policy.parameters()).dtype
    low_precision_copies = section.peft.full_training_modules and base_dtype != torch.float32
    if is_sharded and low_precision_copies and not _mixed_precision(section):
        raise ConfigError(
            f"--peft.full_training_modules on a {base_dtype} base (--policy.dtype) would shard fp32 adapters "
            "and low-precision copies together, and FSDP2 needs one dtype per unit: set "
            "--accelerator.mixed_precision=bf16 (every trainable parameter is then kept in fp32)"
        )


def ignored_modules_pattern(pattern: str | None) -> str | None:
    """`--accelerator.fsdp.ignored_modules` as a PEFT run applies it: matching with or without the
    `base_model.model.` prefix (the run plan records this form, so train_config.json shows what
    accelerate matched). Idempotent; None stays None."""
    if pattern is None or pattern.startswith(_OPTIONAL_PREFIX):
        return pattern
    return f"{_OPTIONAL_PREFIX}(?:{pattern})"


def _check_ignored_modules(model: nn.Module, section: PolicySection) -> None:
    """Refuse an `--accelerator.fsdp.ignored_modules` pattern (in its PEFT form) that matches nothing,
    and one that would leave trainable parameters out of FSDP (their gradients would then never be
    averaged across ranks)."""
    regex = ignored_modules_pattern(section.units.fsdp.ignored_modules)
    if regex is None:
        return
    pattern = re.compile(regex)
    matched = [(name, m) for name, m in model.named_modules() if name and pattern.fullmatch(name)]
    if not matched:
        examples = [name.removeprefix(PEFT_PREFIX) for name, _ in model.named_modules()][2:6]
        raise ConfigError(
            f"--accelerator.fsdp.ignored_modules={regex!r} matches no module of the PEFT model "
            f"(names like {', '.join(examples)}, each also under {PEFT_PREFIX!r}): fix the regex"
        )
    trainable = [
        f"{name}.{pname}" for name, m in matched for pname, p in m.named_parameters() if p.requires_grad
    ]
    if trainable:
        raise ConfigError(
            f"--accelerator.fsdp.ignored_modules keeps trainable parameters out of FSDP ({trainable[0]}), whose "
            "gradients would not be averaged across ranks: ignore only frozen modules"
        )


def _base_reference(path: str | None) -> str | None:
    """The base model as recorded in adapter_config.json: an absolute local path, a URL or a repo id."""
    if path is None or layout.is_url(path) or not os.path.exists(path):
        return path
    return os.path.realpath(path)  # `last` resolved: the base must not move under the adapter


def _jsonable(value: Any) -> Any:
    if isinstance(value, set | frozenset):
        return sorted(value)
    raise TypeError(f"cannot write {type(value).__name__} to adapter_config.json")
