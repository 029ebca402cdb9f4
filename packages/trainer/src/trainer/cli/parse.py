"""Parsing: dotted flags and JSON config files (draccus) into a validated `TrainConfig`."""

from __future__ import annotations

import contextlib
import datetime
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

import draccus

import ckpt_tools
from ckpt_tools import layout
from trainer.cli.lerobot_flags import settle_lerobot_flags
from trainer.cli.lerobot_resume import lerobot_config, lerobot_run_flags
from trainer.config.dataset import DatasetConfig
from trainer.config.environment import EnvConfig
from trainer.config.registry import known_types, register_import_path, split_allow_types
from trainer.config.train import TrainConfig
from trainer.errors import ConfigError
from trainer.policies.common.base import PolicyConfig
from trainer.policies.common.pretrained import policy_defaults

_CONFIG_FLAG = "--config_path"
DEFAULT_TYPES = {"policy": "act_state", "dataset": "pendulum"}
LEROBOT_FLAGS = ("--dataset.repo_id", "--dataset.root")
# a mixture of LeRobotDatasets (data/sources/mixture.py): its file, its weights, or a list of datasets
MIXTURE_FLAGS = ("--dataset.mixture", "--dataset.weights", "--dataset.repo_id=[", "--dataset.root=[")
T = TypeVar("T")


def parse_config(args: Sequence[str]) -> TrainConfig:
    """Flags override the `--config_path` file, which overrides the defaults. With `--resume=true` and
    no `--config_path`, the file is the train_config.json of `--output_dir`'s last checkpoint, if any."""
    allowed, argv = split_allow_types(normalize_argv(args))
    config_path, rest = _split_config_path(settle_lerobot_flags(argv))
    if config_path is None:
        config_path = _auto_resume_config_path(rest)
    flags_given = frozenset(arg[2:].partition("=")[0] for arg in rest if arg.startswith("--"))
    saved_by_lerobot = lerobot_config(config_path)
    if config_path is not None and saved_by_lerobot is not None:  # a LeRobot run: its flags, then ours
        rest = [*lerobot_run_flags(config_path, saved_by_lerobot, _resumes(rest)), *rest]
    with (
        _local_copy(None if saved_by_lerobot else config_path) as local,
        policy_defaults(rest, local) as defaults_path,
    ):
        config = _parse(rest, defaults_path, allowed)  # defaults_path: + `--policy.path`'s config.json
        if _written_before_presets(local) and "use_policy_training_preset" not in flags_given:
            config.use_policy_training_preset = False
    config.config_path = config_path
    config.flags_given = flags_given
    _record_local_paths(config.policy)
    if config.output_dir is None:  # LeRobot's `--output_dir=null`: a new dated directory for the run
        config.output_dir = dated_output_dir("train", config.run_name)
    if not layout.is_url(config.output_dir):  # resolved once: a resume from elsewhere writes the same run
        config.output_dir = os.path.abspath(os.path.expanduser(config.output_dir))
    return config


def _record_local_paths(policy: PolicyConfig) -> None:
    """The policy's path settings (`path_fields`: pi's --policy.size_overrides and --policy.tokenizer_name,
    flags or names --policy.path's checkpoint gives) that name an existing local path, made absolute
    as the run reads them: train_config.json, config.json and an export then name them so from any
    working directory (`trainer export`, `load_policy`, a resume). A Hub repo id is kept as written."""
    for name in policy.path_fields:
        value = getattr(policy, name)
        if isinstance(value, str) and os.path.exists(value):
            setattr(policy, name, os.path.abspath(value))


def dated_output_dir(command: str, job_name: str) -> str:
    """LeRobot's default output directory of lerobot-train (`command` "train") and lerobot-eval ("eval"):
    `outputs/<command>/<date>/<time>_<job_name>`, relative to the working directory."""
    return f"outputs/{command}/{datetime.datetime.now():%Y-%m-%d/%H-%M-%S}_{job_name}"


def _written_before_presets(config_path: str | None) -> bool:
    """Whether a config file predates --use_policy_training_preset (it has no such entry): its
    optimizer and scheduler are the ones its run trained with, so it reads as false and a resumed
    run keeps its schedule."""
    if config_path is None:
        return False
    try:
        return "use_policy_training_preset" not in ckpt_tools.read_config_json(config_path)
    except ckpt_tools.CheckpointError as exc:
        raise ConfigError(f"--config_path={config_path}: {exc}") from None


@contextlib.contextmanager
def _local_copy(config_path: str | None) -> Iterator[str | None]:
    """A config file on a store (`s3://.../train_config.json`) as a local temporary copy, since the
    parser reads local files; a local path (or None) is passed through."""
    if config_path is None or not layout.is_url(config_path):
        yield config_path
        return
    import fsspec

    try:
        with fsspec.open(config_path, "rb", use_listings_cache=False) as handle:
            data = handle.read()
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--config_path={config_path}: cannot read it ({exc})") from None
    with tempfile.TemporaryDirectory(prefix="trainer-config-") as tmp:
        local = os.path.join(tmp, "train_config.json")
        with open(local, "wb") as handle:
            handle.write(data)
        yield local


def normalize_argv(args: Sequence[str]) -> list[str]:
    """The one argv pre-pass: `--flag value` becomes `--flag=value`, so every later look at the flags
    (the config file, the auto-resume, `--policy.path`, the policy type, draccus) sees one spelling."""
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        joins = arg.startswith("--") and "=" not in arg and i + 1 < len(args)
        if joins and not args[i + 1].startswith("--"):
            out.append(f"{arg}={args[i + 1]}")
            i += 2
            continue
        out.append(arg)
        i += 1
    return out


def _resumes(args: list[str]) -> bool:
    """Whether the flags ask for `--resume=true`."""
    values = [arg.partition("=")[2] for arg in args if arg.startswith("--resume=")]
    return bool(values) and values[-1].lower() in ("true", "1", "yes")


def _auto_resume_config_path(args: list[str]) -> str | None:
    """`--resume=true --output_dir=DIR` alone continues that run from its own saved config: the
    train_config.json of its last checkpoint (None before the first save: a fresh start)."""
    values = {}
    for arg in args:
        name, _, value = arg.partition("=")
        if name == "--output_dir":
            values[name] = value
    if not _resumes(args):
        return None
    from trainer.engine.checkpoint.resume import saved_config_path

    return saved_config_path(values.get("--output_dir", TrainConfig.output_dir))


def _parse(rest: list[str], config_path: str | None, allowed: tuple[str, ...]) -> TrainConfig:
    for registry, section in ((PolicyConfig, "policy"), (DatasetConfig, "dataset")):
        settle_choice(rest, config_path, registry, section, allowed)
    check_env_type(rest, config_path)

    def describe(message: str) -> str:
        if "tolerance_s" in message and any(arg.startswith("--dataset.tolerance_s=") for arg in rest):
            return (
                "--tolerance_s applies to a LeRobotDataset's video frames (--dataset.root or --dataset.repo_id): "
                "this run's dataset has none"
            )
        return f"invalid configuration: {message}{_hint(message)}"

    return parse_flags(TrainConfig, rest, config_path, describe)


def parse_flags(
    cls: type[T], args: Sequence[str], config_path: str | None, describe: Callable[[str], str] = str
) -> T:
    """draccus over `args` (flags over the `config_path` file, over the defaults). A bad flag or value,
    which draccus wraps in several exception types, is one `ConfigError` line (`describe` words the
    message); a `ConfigError` a config's own check raised comes through as it is."""
    try:
        return draccus.parse(cls, config_path=config_path, args=list(args), exit_on_error=False)
    except ConfigError:
        raise
    except Exception as exc:
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, ConfigError):
            raise cause from None
        raise ConfigError(describe(" ".join(str(exc).split()))) from None


def _hint(message: str) -> str:
    """ "did you mean --x?" for the first unrecognized flag that is close to a real one."""
    from trainer.cli.flags import suggestion

    _, found, unknown = message.partition("unrecognized arguments:")
    for arg in unknown.split() if found else []:
        meant = suggestion(arg.partition("=")[0].lstrip("-"))
        if meant:
            return f"; did you mean {meant}?"
    return ""


def _split_config_path(args: list[str]) -> tuple[str | None, list[str]]:
    path, rest = None, []
    for arg in args:
        if arg.startswith(_CONFIG_FLAG + "="):
            path = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    return path, rest


def settle_choice(
    rest: list[str],
    config_path: str | None,
    registry: type[draccus.ChoiceRegistry],
    section: str,
    allowed: tuple[str, ...] = (),
) -> None:
    """Name the section's type before draccus sees its fields (draccus needs the choice first):
    `--policy.dim=32` alone means the default policy, and LeRobot's `--dataset.repo_id` / `--dataset.root`
    alone mean a LeRobotDataset, and a mixture's flags (`--dataset.mixture`, `--dataset.weights`, a
    bracketed list of repo ids or roots) a mixture of them, `--dataset.type=lerobot` included. An
    import-path type is registered on the way: one typed as a flag always, one read from the config file
    (a checkpoint's) only when `allowed` (`--allow_types`) names it."""
    flag = f"--{section}.type"
    chosen, from_file = _choice_type(rest, config_path, section)
    mixture = section == "dataset" and any(arg.startswith(MIXTURE_FLAGS) for arg in rest)
    if chosen is None and any(arg.startswith(f"--{section}.") for arg in rest):
        lerobot = section == "dataset" and any(arg.startswith(LEROBOT_FLAGS) for arg in rest)
        chosen = "lerobot" if lerobot else registry.default_choice_name() or DEFAULT_TYPES[section]
        chosen = "mixture" if mixture else chosen
        rest.insert(0, f"{flag}={chosen}")
    elif chosen == "lerobot" and mixture and not from_file:
        chosen = "mixture"
        rest[:] = [f"{flag}={chosen}" if arg.startswith(f"{flag}=") else arg for arg in rest]
    if chosen is not None:
        source = f"the {section} type of {config_path}" if from_file else flag
        register_import_path(registry, chosen, source, allowed=allowed if from_file else None)
        if chosen not in known_types(registry):
            built_in = ", ".join(t for t in known_types(registry) if ":" not in t)
            raise ConfigError(
                f"{flag}={chosen!r} is unknown: choose one of {built_in} or give module.path:ConfigClass"
            )


def check_env_type(args: list[str], config_path: str | None) -> None:
    """`--env.*` needs the environment's type (there is no default environment), one this trainer builds."""
    chosen, _ = _choice_type(args, config_path, "env")
    given = next((arg for arg in args if arg.startswith("--env.")), None)
    if chosen is None and given is not None:
        raise ConfigError(f"{given.partition('=')[0]} needs --env.type=pusht|aloha|pendulum|gym first")
    if chosen is not None and chosen not in known_types(EnvConfig):
        raise ConfigError(
            f"--env.type={chosen}: LeRobot's {chosen} environment is not built here; choose one of "
            f"{', '.join(known_types(EnvConfig))} (docs/evaluation.md)"
        )


def _choice_type(args: list[str], config_path: str | None, section: str) -> tuple[str | None, bool]:
    """The type a flag or the config file asks for in `section` (policy or dataset), and whether it
    came from the file."""
    for arg in reversed(args):
        if arg.startswith(f"--{section}.type="):
            return arg.split("=", 1)[1], False
    if config_path is not None:
        try:  # a checkpoint's file, untrusted: bounded in size and depth before any field is used
            data = ckpt_tools.read_config_json(config_path)
        except ckpt_tools.CheckpointError as exc:
            raise ConfigError(f"--config_path={config_path}: {exc}") from None
        part = data.get(section)
        if isinstance(part, dict) and isinstance(part.get("type"), str):
            return part["type"], True
    return None, False
