"""From an environment config (`--env.*`) to a gymnasium vector environment, and from its observations to
the raw observations a policy reads.

`make_vector_env` imports the package that registers the environment (gym-pusht, gym-aloha, this
trainer's pendulum, a `module:Name-v0` id), and steps `count` copies together: in this process
(SyncVectorEnv) or one process each (AsyncVectorEnv, `--eval.use_async_envs`). The id is always given
as `module:id`, so a worker process imports the module itself. Every failure to build is one
`ConfigError` line naming the environment and the fix.

`raw_observations` names a step's observations as the policy's features: the environment's keys (a
nested key joined with `/`, an array observation called `observation`) through `--env.features_map`
(LeRobot's names, `pixels` -> `observation.image`) and then the run's `--rename_map`.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from trainer.config.environment import EnvConfig
from trainer.config.registry import ALLOW_TYPES_FLAG
from trainer.data.dataset import TASK_KEY
from trainer.errors import ConfigError

ARRAY_KEY = "observation"  # the key of an observation that is one array, not a dict
VectorEnv = gym.vector.SyncVectorEnv | gym.vector.AsyncVectorEnv


def make_vector_env(config: EnvConfig, count: int, use_async: bool) -> VectorEnv:
    """`count` copies of the environment stepped together (one in this process when `count` is 1)."""
    gym_id = _registered_id(config)
    make = functools.partial(_make_one, gym_id, config.disable_env_checker, config.gym_kwargs())
    try:
        if use_async and count > 1:
            return gym.vector.AsyncVectorEnv([make] * count, context="forkserver")
        return gym.vector.SyncVectorEnv([make] * count)
    except Exception as exc:  # an environment that cannot be built: its own message, one line
        raise ConfigError(
            f"--env.type={config.type}: {gym_id} could not be built ({type(exc).__name__}: "
            f"{' '.join(str(exc).split())[:300]})"
        ) from None


def check_imports(config: EnvConfig, allowed: Sequence[str]) -> None:
    """A `gym` environment read from a saved config (a run's train_config.json) may name a module to
    import only when `--allow_types` lists its id: importing runs the module's code."""
    if config.type == "gym" and config.package is not None and config.task not in allowed:
        raise ConfigError(
            f"the run's --env.task={config.task} would import and run the module {config.package}: "
            f"refused for a saved config; if you trust it, pass {ALLOW_TYPES_FLAG}={config.task}"
        )


def _registered_id(config: EnvConfig) -> str:
    """The `module:id` that makes the environment in any process; its module imported here once, so a
    missing package is one line before any worker starts."""
    package = config.package
    gym_id = config.gym_id
    if package is None:
        bare = gym_id
    else:
        try:
            importlib.import_module(package)
        except ModuleNotFoundError as exc:
            raise ConfigError(
                f"--env.type={config.type} needs the module {package}, which is not installed ({exc.name} is "
                f"missing): {config.install_hint()}"
            ) from None
        bare = gym_id.partition(":")[2] if ":" in gym_id else gym_id
    if bare not in gym.registry:
        raise ConfigError(
            f"--env.type={config.type}: no gymnasium environment {bare!r} is registered"
            + (f" after importing {package}" if package else "")
            + "; check --env.task"
        )
    return f"{package}:{bare}" if package else bare


def _make_one(gym_id: str, disable_env_checker: bool, kwargs: Mapping[str, Any]) -> gym.Env[Any, Any]:
    return gym.make(gym_id, disable_env_checker=disable_env_checker, **kwargs)


def flat_observations(observation: Any) -> dict[str, Any]:
    """A vector environment's observation as `{key: batched value}`, nested dicts joined with `/`."""
    if not isinstance(observation, Mapping):
        return {ARRAY_KEY: observation}
    flat: dict[str, Any] = {}
    for key, value in observation.items():
        if isinstance(value, Mapping):
            flat.update({f"{key}/{inner}": v for inner, v in flat_observations(value).items()})
        else:
            flat[key] = value
    return flat


def feature_names(config: EnvConfig, rename_map: Mapping[str, str]) -> dict[str, str]:
    """Environment key -> the policy feature it is read as (`--env.features_map`, then `--rename_map`)."""
    return {key: rename_map.get(name, name) for key, name in config.features_map.items()}


def raw_observations(
    observation: Any, names: Mapping[str, str], tasks: Sequence[str] | None
) -> dict[str, Any]:
    """The batched raw observation a policy reads (`LoadedPolicy.select_action`): each mapped key
    under its feature name (cameras as uint8 (B, H, W, C), vectors as float32 (B, n)), and the task
    text of each environment when the policy reads one."""
    raw: dict[str, Any] = {}
    for key, value in flat_observations(observation).items():
        name = names.get(key)
        if name is None:
            continue
        array = np.asarray(value)
        raw[name] = array if array.dtype == np.uint8 else array.astype(np.float32, copy=False)
    if tasks is not None:
        raw[TASK_KEY] = list(tasks)
    return raw


def check_features(config: EnvConfig, wanted: Sequence[str], rename_map: Mapping[str, str]) -> None:
    """A policy that reads a feature the environment gives no value for is one line, before any episode."""
    given = set(feature_names(config, rename_map).values())
    missing = [name for name in wanted if name not in given and name != TASK_KEY]
    if missing:
        raise ConfigError(
            f"the policy reads {missing[0]!r}, which --env.type={config.type} gives no value for (it gives "
            f"{', '.join(sorted(given))}): map the environment's key to it with "
            f'--env.features_map (or --rename_map=\'{{"<its name>": "{missing[0]}"}}\')'
        )
