"""`--X.type=package.module:ConfigClass`: choice types that live outside the trainer.

Policies and datasets are both draccus choice registries; an import path as the type name makes an
outside config class usable without registering it first, and the saved train_config.json, which
records the same name, finds the class again.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection
from typing import Any, TypeVar

import draccus

from trainer.errors import ConfigError

ALLOW_TYPES_FLAG = "--allow_types"


def imported(module: str, name: str) -> Any:
    """`name` of `module`, imported when called: how a policy's config reaches its class and its
    LeRobot adapter, which import the config themselves (by a name, so imports flow one way)."""
    return getattr(importlib.import_module(module), name)


def register_import_path(
    registry: type[draccus.ChoiceRegistry],
    type_name: str,
    flag: str,
    *,
    allowed: Collection[str] | None = None,
) -> None:
    """Import `module:Class` and register it in `registry` under that name (other names: no-op).

    `allowed` is None for a name the caller typed (a flag, code). A name read from a file (a
    checkpoint's config.json, a saved train_config.json) passes the caller's allow-list instead:
    importing a module runs its code, and a downloaded checkpoint must not choose code to run, so an
    unregistered type outside the list is refused before anything is imported."""
    if ":" not in type_name or type_name in registry.get_known_choices():
        return
    module_name, _, class_name = type_name.partition(":")
    if allowed is not None and type_name not in allowed:
        raise ConfigError(
            f"{flag} is {type_name[:120]!r}, which would import and run the module {module_name[:120]!r}: "
            "refused, a saved file may name only built-in or registered types; if you trust it, allow it "
            f"with {ALLOW_TYPES_FLAG}={type_name[:120]} (load_policy(path, allow_types=[...]) in code)"
        )
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


def split_allow_types(args: list[str]) -> tuple[tuple[str, ...], list[str]]:
    """`--allow_types=a.b:C,d:E` (the `module:Class` types a saved file may name) taken out of the
    arguments. It is a command-line flag only, never a config field: a saved file listing its own
    types would allow itself."""
    allowed: list[str] = []
    rest = []
    for arg in args:
        if arg.startswith(ALLOW_TYPES_FLAG + "="):
            value = arg.split("=", 1)[1].strip().removeprefix("[").removesuffix("]")
            allowed += [name.strip() for name in value.split(",") if name.strip()]
        else:
            rest.append(arg)
    return tuple(allowed), rest


def known_types(registry: type[draccus.ChoiceRegistry]) -> list[str]:
    return sorted(registry.get_known_choices())
