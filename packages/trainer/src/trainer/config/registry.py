"""`--X.type=package.module:ConfigClass`: choice types that live outside the trainer.

Policies and datasets are both draccus choice registries; an import path as the type name makes an
outside config class usable without registering it first, and the saved train_config.json, which
records the same name, finds the class again.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TypeVar

import draccus

from trainer.errors import ConfigError


def register_import_path(registry: type[draccus.ChoiceRegistry], type_name: str, flag: str) -> None:
    """Import `module:Class` and register it in `registry` under that name (other names: no-op)."""
    if ":" not in type_name or type_name in registry.get_known_choices():
        return
    module_name, _, class_name = type_name.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"{flag}={type_name!r}: cannot import {class_name} from {module_name} ({exc}); "
            f"give module.path:ConfigClass of an importable {registry.__name__} subclass"
        ) from None
    if not (isinstance(cls, type) and issubclass(cls, registry)):
        raise ConfigError(f"{flag}={type_name!r} names {cls!r}, which is not a {registry.__name__} subclass")
    registry.register_subclass(type_name, cls)


Choice = TypeVar("Choice", bound=draccus.ChoiceRegistry)


def registered_default(registry: type[Choice], type_name: str, package: str) -> Callable[[], Choice]:
    """The default factory of a choice field: an instance of the type registered as `type_name`. The
    built-in types register themselves where they are defined, when `package` is imported (the CLI,
    `load_policy` and the dataset commands import it), so this config module names no class of theirs."""

    def build() -> Choice:
        try:
            choice: type[Choice] = registry.get_choice_class(type_name)
        except KeyError:
            raise ConfigError(
                f"no {registry.__name__} is registered as {type_name!r}: import {package} first "
                "(importing it registers the built-in types)"
            ) from None
        return choice()

    return build


def known_types(registry: type[draccus.ChoiceRegistry]) -> list[str]:
    return sorted(registry.get_known_choices())
