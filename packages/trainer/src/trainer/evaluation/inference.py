"""`trainer.load_policy(path)`: from any saved form of a policy to one that acts on raw observations.

The path may be a step directory, `checkpoints/last`, a run's output_dir, a `pretrained_model/`, a
`ckpt convert --output` or `ckpt merge-adapter -o` directory, a published copy, or a Hub repo id (read
through the Hugging Face cache). Weights come through ckpt_tools in whatever format the checkpoint
holds (safetensors, DCP shards, a PEFT adapter merged into the base its adapter_config.json records),
so every form of one checkpoint gives the same actions.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import draccus
import torch

import ckpt_tools
from ckpt_tools import layout
from trainer.config.dataset import Embodiment
from trainer.config.registry import register_import_path
from trainer.data.dataset import ACTION_KEY, OBS_KEY
from trainer.data.pipeline.processors import Processor, observation_batch
from trainer.errors import ConfigError
from trainer.policies import Policy, PolicyConfig, build_policy, upgrade_policy_config
from trainer.policies.common import pretrained
from trainer.policies.common.base import policy_of


@dataclass
class LoadedPolicy:
    """A policy with the processors it was trained with, in eval mode on `device`."""

    policy: Policy
    preprocessor: Processor
    postprocessor: Processor
    device: torch.device
    weights: str = "model"  # which weight set was loaded: "model" or "ema"
    embodiment: Embodiment | None = None  # the robot it acts for, of a policy trained on several

    @property
    def config(self) -> PolicyConfig:
        return self.policy.config

    @property
    def input_features(self) -> list[str]:
        """The observation features `select_action` reads (vectors concatenated in this order)."""
        return list(self.config.input_features) or [OBS_KEY]

    @torch.no_grad()
    def select_action(self, observation: Mapping[str, Any]) -> torch.Tensor:
        """The next action, in the dataset's units, for raw observations: a dict holding each input
        feature, batched or not (an unbatched one gives an `[action_dim]` action). Vectors are `[n]` or
        `[B, n]`; camera frames uint8 `H x W x 3` arrays as a camera gives them, or `(C, H, W)` tensors
        (uint8, or float in [0, 1] as LeRobot's dataset gives them), with a leading batch dimension or
        not (processors.observation_batch). ACT acts from its action queue: call `reset()` between
        episodes."""
        batch, single = observation_batch(observation, self.input_features)
        action = self.act(batch)
        return action[0] if single else action

    @torch.no_grad()
    def act(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Actions (dataset units) for a raw batch: `observation.state` with the vector features
        concatenated, cameras as (B, C, H, W) frames."""
        raw = {name: value.to(self.device) for name, value in batch.items() if name in self._batch_keys}
        normalized = self.preprocessor(raw)
        dtype = _param_dtype(self.policy)
        action = self.policy.select_action({k: v.to(dtype) for k, v in normalized.items()}).float()
        unnormalized = self.postprocessor({ACTION_KEY: action})[ACTION_KEY]
        hooks = policy_of(self.policy)  # the policy itself, or the one inside a PEFT wrapper
        return unnormalized if hooks is None else hooks.finish_actions(unnormalized)

    def reset(self) -> None:
        """Start a new episode (empties ACT's action queue and temporal ensemble)."""
        self.policy.reset()

    @property
    def _batch_keys(self) -> set[str]:
        return {OBS_KEY, *self.input_features}


def load_policy(
    path: str,
    device: str | torch.device = "cpu",
    weights: str | None = None,
    *,
    allow_types: Collection[str] = (),
    embodiment: str | None = None,
    **fields: Any,
) -> LoadedPolicy:
    """Load the policy saved at `path` (see the module docstring for the accepted forms).

    The saved config.json may name a built-in or already registered policy type; a `module:Class`
    type is imported only when `allow_types` lists it (importing runs the module's code, and a
    checkpoint from elsewhere must not choose code to run).

    `weights`: "model" (the trained parameters' last values) or "ema" (their `--ema.enable` average);
    None takes the EMA when the checkpoint holds one, since a run that kept an EMA kept it to be used
    (LeRobot's evaluation does the same), and the model otherwise (`Checkpoint.choose_weights`: a name
    that is no weight set, or a set the checkpoint lacks, is one line). `LoadedPolicy.weights` says which.

    `embodiment`: for a policy trained on a mixture of robots that differ (its processors list them:
    `config.dataset.Embodiment`), the robot to act for, by its member's name; None takes the first (the
    default embodiment). The policy then reads that robot's raw observations (its state size, its
    cameras), is normalized by its statistics and returns its actions (`LoadedPolicy.embodiment`). A
    name the checkpoint lacks is one line listing those it has, as is a name given for a policy of one
    robot.

    `fields` set policy config fields over the saved ones, for what a checkpoint does not record: a
    LeRobot pi0/pi0.5 of other than LeRobot's sizes needs `size_overrides=PATH` (its config.json names
    LeRobot's variants only; docs/pi.md)."""
    local = pretrained.resolve(path)
    try:
        checkpoint = ckpt_tools.open_checkpoint(local)
        chosen = checkpoint.choose_weights(weights)
        saved = checkpoint.policy_config()
        processors = ckpt_tools.load_processors(local)
    except ckpt_tools.CheckpointError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    saved = {**upgrade_policy_config(saved, pretrained.saved_preprocessor(processors)), **fields}
    config = _policy_config(saved, path, tuple(allow_types))
    pre, post = _processors(processors, config, path)
    robot = choose_embodiment(pre.embodiments, embodiment, path)
    if robot is not None:
        config = config.for_embodiment(robot)
        pre, post = pre.for_embodiment(robot), post.for_embodiment(robot)
    state = pretrained.read_weights(path, chosen)
    _check_config_fits(config, state, path)  # before anything of the config's size is allocated
    policy = build_policy(config, config.obs_dim, config.action_dim)
    pretrained.fit_weights(policy, state, path)
    target = torch.device(device)
    policy.to(target).eval()
    return LoadedPolicy(policy, pre, post, target, weights=chosen, embodiment=robot)


def choose_embodiment(embodiments: Sequence[Embodiment], name: str | None, path: str) -> Embodiment | None:
    """The embodiment named `name` among a checkpoint's (the first when None; None for a policy of one
    robot, which takes no name): one line listing those it has otherwise."""
    if not embodiments:
        if name is not None:
            raise ConfigError(
                f"{path} was trained on one robot's data and has no embodiments: drop embodiment={name}"
            )
        return None
    if name is None:
        return embodiments[0]
    found = next((e for e in embodiments if e.name == name), None)
    if found is None:
        raise ConfigError(
            f"{path} has no embodiment {name!r}: it has {', '.join(e.name for e in embodiments)}"
        )
    return found


def _policy_config(saved: dict[str, Any], path: str, allow_types: tuple[str, ...]) -> PolicyConfig:
    policy_type = saved.get("type")
    if not isinstance(policy_type, str):
        raise ConfigError(f"{path}: its config.json names no policy type")
    register_import_path(PolicyConfig, policy_type, f"the policy type of {path}", allowed=allow_types)
    try:
        config = draccus.decode(PolicyConfig, saved)
    except Exception as exc:  # draccus reports unknown fields and bad values in several types
        if isinstance(exc.__cause__, ConfigError):  # a config's own check: its line says what to fix
            raise ConfigError(f"{path}: {exc.__cause__}") from None
        raise ConfigError(
            f"{path}: its config.json does not describe a policy ({' '.join(str(exc).split())})"
        ) from None
    assert isinstance(config, PolicyConfig)
    return config


def _check_config_fits(config: PolicyConfig, state: Mapping[str, Any], path: str) -> None:
    """Build the policy the config describes on the meta device (no memory) and compare its tensor
    names and shapes with the saved weights: a config edited to hidden_dim=200000 is one line, not a
    160 GB allocation."""
    with torch.device("meta"):
        shell = build_policy(config, config.obs_dim, config.action_dim)
    wanted = {name: tuple(t.shape) for name, t in shell.state_dict().items()}
    saved = {name: tuple(t.shape) for name, t in pretrained.under_own_names(config, dict(state)).items()}
    resized = sorted(name for name in wanted.keys() & saved.keys() if wanted[name] != saved[name])
    missing = sorted(wanted.keys() - saved.keys())
    if resized or missing:
        first = (
            f"{resized[0]} is {list(saved[resized[0]])} in the weights but {list(wanted[resized[0]])} by the config"
            if resized
            else f"the weights lack {missing[0]}"
        )
        raise ConfigError(
            f"{path}: its config.json does not describe its weights ({len(resized)} resized, {len(missing)} "
            f"missing; {first}): the config or the weights were edited or mixed up"
        )


def _processors(
    processors: Mapping[str, ckpt_tools.ProcessorState], config: PolicyConfig, path: str
) -> tuple[Processor, Processor]:
    """The saved pre/post-processors, checked against their step files and the policy's feature sizes."""
    missing = [name for name in (layout.PREPROCESSOR, layout.POSTPROCESSOR) if name not in processors]
    if missing:
        raise ConfigError(
            f"{path} holds no {missing[0]}.json: it was saved without its normalization statistics"
        )
    sizes = {key: size for key, size in ((OBS_KEY, config.obs_dim), (ACTION_KEY, config.action_dim)) if size}
    built = []
    for name in (layout.PREPROCESSOR, layout.POSTPROCESSOR):
        try:
            built.append(Processor.from_state(processors[name].config, processors[name].step_tensors, sizes))
        except ConfigError as exc:
            raise ConfigError(f"{path}: {name}: {exc}") from None
    return built[0], built[1]


def _param_dtype(policy: Policy) -> torch.dtype:
    return next(policy.parameters()).dtype
