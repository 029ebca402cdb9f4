"""Parsing: dotted flags and JSON config files (draccus) into a validated `TrainConfig`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import draccus

from trainer.config.train import TrainConfig
from trainer.errors import ConfigError
from trainer.policies.base import PolicyConfig, known_types, register_import_path
from trainer.pretrained import policy_defaults

_CONFIG_FLAG = "--config_path"


def parse_config(args: Sequence[str]) -> TrainConfig:
    """Flags override the `--config_path` file, which overrides the defaults. With `--resume=true` and
    no `--config_path`, the file is the train_config.json of `--output_dir`'s last checkpoint, if any."""
    config_path, rest = _split_config_path(list(args))
    if config_path is None:
        config_path = _auto_resume_config_path(rest)
    flags_given = frozenset(arg[2:].partition("=")[0] for arg in rest if arg.startswith("--"))
    with policy_defaults(rest, config_path) as defaults_path:  # `--policy.path`'s config.json
        config = _parse(rest, defaults_path)
    config.config_path = config_path
    config.flags_given = flags_given
    return config


def _auto_resume_config_path(args: list[str]) -> str | None:
    """`--resume=true --output_dir=DIR` alone continues that run from its own saved config: the
    train_config.json of its last checkpoint (None before the first save: a fresh start)."""
    values = {}
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name in ("--resume", "--output_dir"):
            values[name] = value if eq else (args[i + 1] if i + 1 < len(args) else "")
    if values.get("--resume", "").lower() not in ("true", "1", "yes"):
        return None
    from trainer.resume import saved_config_path

    return saved_config_path(values.get("--output_dir", TrainConfig.output_dir))


def _parse(rest: list[str], config_path: str | None) -> TrainConfig:
    policy_type = _policy_type(rest, config_path)
    if policy_type is None and any(arg.startswith("--policy.") for arg in rest):
        # draccus needs the choice named before its fields: `--policy.dim=32` means the default type.
        policy_type = PolicyConfig.default_choice_name() or "act"
        rest.insert(0, f"--policy.type={policy_type}")
    if policy_type is not None:
        register_import_path(policy_type)
        if policy_type not in known_types():
            raise ConfigError(
                f"--policy.type={policy_type!r} is unknown: choose one of {', '.join(known_types())} "
                "or give module.path:ConfigClass"
            )
    try:
        config = draccus.parse(TrainConfig, config_path=config_path, args=rest, exit_on_error=False)
    except ConfigError:
        raise
    except Exception as exc:  # draccus wraps bad flags and bad values in several exception types
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, ConfigError):
            raise cause from None
        raise ConfigError(f"invalid configuration: {' '.join(str(exc).split())}{_hint(str(exc))}") from None
    return config


def _hint(message: str) -> str:
    """ "did you mean --x?" for the first unrecognized flag that is close to a real one."""
    from trainer.config.flags import suggestion

    _, found, unknown = message.partition("unrecognized arguments:")
    for arg in unknown.split() if found else []:
        meant = suggestion(arg.partition("=")[0].lstrip("-"))
        if meant:
            return f"; did you mean {meant}?"
    return ""


def encode_config(config: TrainConfig) -> dict[str, Any]:
    """The JSON-ready dict written as train_config.json."""
    return draccus.encode(config)


def _split_config_path(args: list[str]) -> tuple[str | None, list[str]]:
    path, rest, i = None, [], 0
    while i < len(args):
        arg = args[i]
        if arg == _CONFIG_FLAG and i + 1 < len(args):
            path, i = args[i + 1], i + 2
            continue
        if arg.startswith(_CONFIG_FLAG + "="):
            path = arg.split("=", 1)[1]
        else:
            rest.append(arg)
        i += 1
    return path, rest


def _policy_type(args: list[str], config_path: str | None) -> str | None:
    """The policy type a flag or the config file asks for (needed before draccus sees the choice)."""
    for arg in reversed(args):
        if arg.startswith("--policy.type="):
            return arg.split("=", 1)[1]
    if config_path is not None:
        try:
            with open(config_path, encoding="utf-8") as handle:
                data = json.load(handle)
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"--config_path={config_path}: cannot read it as JSON ({exc})") from None
        policy = data.get("policy") if isinstance(data, dict) else None
        if isinstance(policy, dict) and isinstance(policy.get("type"), str):
            return policy["type"]
    return None
