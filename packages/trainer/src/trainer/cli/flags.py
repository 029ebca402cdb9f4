"""Every `trainer train` flag, read from the config dataclasses themselves.

One source for `trainer train --help` and the flag table of docs/training.md (a test keeps the page equal
to `markdown_table()`), so no flag goes undocumented and no default drifts from the code. A field's
meaning is its attribute docstring, the text under it in the dataclass.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from dataclasses import dataclass
from typing import Any

import draccus
from draccus.wrappers.docstring import get_attribute_docstring

from trainer.config.dataset import DatasetConfig
from trainer.config.environment import EnvConfig
from trainer.config.optim import OptimizerConfig, SchedulerConfig
from trainer.config.registry import known_types
from trainer.config.train import TrainConfig
from trainer.policies.common.base import PolicyConfig

# choice registry -> (what it chooses, the meaning of its --X.type flag, whether an import path may name one)
CHOICES: dict[type[draccus.ChoiceRegistry], tuple[str, str, bool]] = {
    PolicyConfig: ("policy", "Policy to train", True),
    DatasetConfig: ("dataset", "Demonstrations to train on", True),
    OptimizerConfig: ("optimizer", "Optimizer (with --use_policy_training_preset=false)", False),
    SchedulerConfig: ("scheduler", "Learning-rate schedule (with --use_policy_training_preset=false)", False),
    EnvConfig: ("env", "Environment the checkpoints are scored in (docs/evaluation.md); unset: none", False),
}

CONFIG_PATH_HELP = (
    "JSON config file to start from (a checkpoint's train_config.json reproduces its run); flags "
    "override it. With --resume=true it names the checkpoint to continue (docs/resume.md)."
)


@dataclass(frozen=True)
class Flag:
    """One command-line flag: its dotted name, default (as typed on the command line) and meaning."""

    name: str
    default: str
    meaning: str


def all_flags(policy_type: str | None = None) -> list[Flag]:
    """Every flag of `trainer train`, in the order of the config tree; `--policy.*` fields of one
    policy type only are marked with it (e.g. "(act)"). With `policy_type`, only that type's fields."""
    return [Flag("--config_path", "-", CONFIG_PATH_HELP), *_walk(TrainConfig(), "--", policy_type)]


def markdown_table() -> str:
    """The flag table of docs/training.md."""
    lines = ["| flag | default | meaning |", "|---|---|---|"]
    lines += [f"| `{f.name}` | {f.default} | {_escape(f.meaning)} |" for f in all_flags()]
    return "\n".join(lines)


def help_text(policy_type: str | None = None) -> str:
    """The flag list `trainer train [--policy.type=T] --help` prints."""
    return "\n".join(f"  {f.name}={f.default}\n      {f.meaning}" for f in all_flags(policy_type))


def suggestion(name: str) -> str | None:
    """The flag an unknown `--name` most likely meant (dashes for underscores, a typo), or None."""
    names = [flag.name for flag in all_flags()]
    normalized = name.replace("-", "_").lstrip("_")
    if f"--{normalized}" in names:
        return f"--{normalized}"
    close = difflib.get_close_matches(f"--{normalized}", names, n=1, cutoff=0.75)
    return close[0] if close else None


def _walk(config: Any, prefix: str, policy_type: str | None = None) -> list[Flag]:
    flags = []
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        name = f"{prefix}{field.name}"
        registry = next((r for r in CHOICES if isinstance(value, r)), None)
        if value is None:  # an optional choice left unset (--env.*): its types' flags all the same
            registry = _optional_choice(type(config), field.name)
        if registry is not None:
            chosen = value.type if value is not None else "-"
            flags += _choice_flags(name, chosen, registry, policy_type if registry is PolicyConfig else None)
        elif dataclasses.is_dataclass(value):
            flags += _walk(value, f"{name}.")
        else:
            flags.append(Flag(name, _render(value), _meaning(type(config), field.name)))
    return flags


def _optional_choice(owner: type, name: str) -> type[draccus.ChoiceRegistry] | None:
    """The choice registry of a field typed `Choice | None` (`TrainConfig.env`), else None."""
    hint = typing.get_type_hints(owner).get(name)
    return next((arg for arg in typing.get_args(hint) if arg in CHOICES), None)


def _choice_flags(name: str, default: str, registry: Any, only: str | None) -> list[Flag]:
    """`--X.type`, the fields every type has, then each built-in type's own fields, marked with it
    (or only the fields of type `only`)."""
    built_in = _shipped_types(registry)
    what, meaning, import_paths = CHOICES[registry]
    own_type = f", or module.path:ConfigClass for your own {what}" if import_paths else ""
    choices = f"{', '.join(built_in)}{own_type}"
    flags = [Flag(f"{name}.type", only or default, f"{meaning}: {choices}.")]
    common = {field.name for field in dataclasses.fields(registry)}
    for field in dataclasses.fields(registry):
        flags.append(Flag(f"{name}.{field.name}", _render(_default(field)), _meaning(registry, field.name)))
    # a field several types declare is one flag: "(a, b) meaning" when they agree, else
    # "default / default" and "(a) meaning (b) meaning"
    own: dict[str, list[tuple[str, str, str]]] = {}  # flag -> (type, default, meaning) of each type
    for choice in [only] if only else built_in:
        cls = registry.get_choice_class(choice)
        for field in dataclasses.fields(cls):
            if field.name in common:
                continue
            if dataclasses.is_dataclass(_default(field)):  # a nested group, e.g. --dataset.image_transforms.*
                for f in _walk(_default(field), f"{name}.{field.name}."):
                    own.setdefault(f.name, []).append((choice, f.default, f.meaning))
                continue
            entry = (choice, _render(_default(field)), _meaning(cls, field.name))
            own.setdefault(f"{name}.{field.name}", []).append(entry)
    return flags + [_merged(flag, entries) for flag, entries in own.items()]


def _shipped_types(registry: Any) -> list[str]:
    """The types the trainer ships: not those a user's package registers (by name or import path),
    so the flag table and `--help` read the same whatever else a process has imported."""
    return [
        t for t in known_types(registry) if registry.get_choice_class(t).__module__.startswith("trainer.")
    ]


def _merged(name: str, entries: list[tuple[str, str, str]]) -> Flag:
    """One flag declared by several choice types: their names in front of the meaning they share."""
    choices, defaults, meanings = zip(*entries, strict=True)
    if len(set(defaults)) == 1 and len(set(meanings)) == 1:
        return Flag(name, defaults[0], f"({', '.join(choices)}) {meanings[0]}")
    text = " ".join(f"({choice}) {meaning}" for choice, _, meaning in entries)
    return Flag(name, " / ".join(defaults), text)


def _default(field: dataclasses.Field[Any]) -> Any:
    """A field's default without building the config (a type may require some of its fields)."""
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None if field.default is dataclasses.MISSING else field.default


def _meaning(cls: type, name: str) -> str:
    """The attribute docstring, on one line, from the class that declares the field."""
    owner = next(c for c in cls.__mro__ if name in getattr(c, "__annotations__", {}))
    return " ".join(get_attribute_docstring(owner, name).docstring_below.split())


def _escape(text: str) -> str:
    return text.replace("|", "\\|")  # a pipe would end the table cell


def _render(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict):  # named entries (e.g. the transforms): their names
        return "{" + ",".join(value) + "}"
    if isinstance(value, tuple | list):
        return f"[{','.join(str(v) for v in value)}]"
    return str(value)
