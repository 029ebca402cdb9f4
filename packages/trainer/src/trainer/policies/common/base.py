"""The policy interface and the policy type registry.

A policy is an `nn.Module` built from its config and the dataset's feature sizes. It returns
`(loss, metrics)` from `forward(batch)` and an action from `select_action(batch)`, where a batch holds
the normalized `observation.state` vector and, for a policy that sees, each camera's normalized frames
as `observation.images.<name>` (B, C, H, W). `reset()` starts a new episode (ACT's action queue).

Every hook the engine reads of a policy is declared on `Policy` with its default: how it shards
(`_fsdp_wrap_modules`, `_fsdp_forward_methods`), its LoRA targets (`peft_target_modules`), how its
modules are initialized on the meta device (`initializes`, `initialize_module`), the weights of its
pretrained parts, its parameter groups and what it computes from the data's tasks before step 1
(`prepare_tasks`). What a policy decides from its config alone (the frames it
reads: `observation_delta_indices` / `action_delta_indices`, its training preset, its normalization, its
LeRobot form: `lerobot_adapter`) is declared on `PolicyConfig` (config/policy.py). The engine reaches a policy's
hooks through `policy_of`, also inside a PEFT wrapper, never by `getattr`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import nn

from trainer.config import registry
from trainer.config.dataset import Dataset
from trainer.config.policy import PolicyConfig
from trainer.data.dataset import is_camera
from trainer.errors import ConfigError


class Policy(nn.Module):
    """Base class of the policies the engine trains."""

    _fsdp_wrap_modules: ClassVar[tuple[str, ...]] = ()
    """Class names of the modules that become FSDP2 units (and the units of activation checkpointing
    and per-unit compile): modules whose `forward()` runs, so FSDP's hooks gather their parameters."""
    _fsdp_forward_methods: ClassVar[tuple[str, ...]] = ("select_action",)
    """Entry points other than `forward` that need the sharded parameters gathered."""

    def __init__(self, config: PolicyConfig) -> None:
        super().__init__()
        self.config = config

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        raise NotImplementedError

    def select_action(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The next action for a batch of (normalized) observations."""
        raise NotImplementedError

    def reset(self) -> None:
        """Forget what earlier steps of an episode left behind (a policy without memory has nothing)."""

    def finish_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """Actions in the dataset's units (after the unnormalizer) as the robot takes them: what the
        policy's LeRobot postprocessor does after its unnormalizer (FastWAM's gripper toggle). As they
        are by default."""
        return actions

    def peft_target_modules(self) -> tuple[str, ...]:
        """The modules (names or suffixes) `--peft` adds adapters to when --peft.target_modules is
        unset; none by default (such a policy needs the flag)."""
        return ()

    def load_pretrained_parts(self) -> None:
        """Load the pretrained weights the config names for parts of a freshly built policy (ACT's
        camera trunk); called at the start of training, not when a checkpoint's weights follow."""

    def loads_pretrained_parts(self) -> bool:
        """Whether `load_pretrained_parts()` has weights to load: such a policy is built whole on every
        rank (engine/build.py), since the parts are read into a real, unsharded module. By default,
        whether the class overrides `load_pretrained_parts` (override this to say when it loads none)."""
        return type(self).load_pretrained_parts is not Policy.load_pretrained_parts

    def initializes(self, module: nn.Module) -> bool:
        """Whether `initialize_module` can initialize `module`'s own tensors. A policy is built on the
        meta device only when every module owning a tensor passes (engine/build.py); by default, the
        modules with torch's `reset_parameters()`."""
        return callable(getattr(module, "reset_parameters", None))

    def initialize_module(self, module: nn.Module) -> None:
        """Initialize `module`'s own parameters and buffers (not its children's) as a fresh build does,
        on the meta build's full-shape twin: torch's `reset_parameters()` by default. A policy made of
        another library's modules routes them to that library's initializer (SmolVLA: transformers')."""
        module.reset_parameters()  # type: ignore[operator]  # checked by `initializes`

    def parameter_groups(self) -> dict[str, float]:
        """Submodules trained at their own learning rate, by name (ACT's camera trunk): each becomes an
        optimizer parameter group; the rest uses --optimizer.lr."""
        return {}

    def prepare_tasks(self, tasks: Sequence[str], device: torch.device) -> None:
        """The distinct task texts of the run's data (training and held-out), given once before step 1
        on every rank: a policy whose input for a task depends on the task alone computes it now and
        may release what computed it (FastWAM's frozen text encoder). Nothing by default."""

    def takes_tasks(self) -> bool:
        """Whether `prepare_tasks()` uses the tasks: only then does the engine ask the data for them,
        so a dataset plug-in that never serves such a policy need not list its tasks. By default,
        whether the class overrides `prepare_tasks`."""
        return type(self).prepare_tasks is not Policy.prepare_tasks


def policy_of(model: nn.Module) -> Policy | None:
    """The policy whose hooks `model` follows: itself, or the base inside its PEFT wrapper; None for
    any other module (which declares no hook)."""
    if isinstance(model, Policy):
        return model
    from peft import PeftModel

    if isinstance(model, PeftModel):
        base = model.get_base_model()
        return base if isinstance(base, Policy) else None
    return None


def optimizer_params(model: nn.Module, policy: Policy) -> list[nn.Parameter] | list[dict[str, Any]]:
    """What the optimizer updates: the trainable parameters of `model` (the policy, or its PEFT
    wrapper), split into the groups `policy.parameter_groups()` names; a plain list when it names none,
    so the optimizer state of a one-group policy keeps the layout earlier checkpoints hold."""
    trainable = [(name, param) for name, param in model.named_parameters() if param.requires_grad]
    groups = policy.parameter_groups()
    if not groups:
        return [param for _, param in trainable]

    def group_of(name: str) -> str | None:
        return next((g for g in groups if g in name.split(".")), None)

    rest: dict[str, Any] = {"params": [param for name, param in trainable if group_of(name) is None]}
    named: list[dict[str, Any]] = [
        {"params": [p for n, p in trainable if group_of(n) == g], "lr": lr} for g, lr in groups.items()
    ]
    return [rest, *(group for group in named if group["params"])]


def build_policy(config: PolicyConfig, obs_dim: int, action_dim: int) -> Policy:
    """The policy in its dtype, with the feature sizes the config left open (0) taken from the
    arguments. The caller's config is not edited: the policy gets a copy (a run's plan records the
    sizes in its own config, plan.resolve_policy_features)."""
    config = dataclasses.replace(
        config, obs_dim=config.obs_dim or obs_dim, action_dim=config.action_dim or action_dim
    )
    policy = config.policy_class()(config)
    if not isinstance(policy, Policy):
        raise ConfigError(
            f"{type(config).__name__}.policy_class() built a {type(policy).__name__}, not a "
            "trainer.policies.Policy subclass; return one"
        )
    if config.cast_dtype is not None:
        policy.to(getattr(torch, config.cast_dtype))
    return policy


def fit_to_data(config: PolicyConfig, dataset: Dataset) -> PolicyConfig:
    """`config` as the data shapes it (a new object): the features the dataset resolved, the sizes
    left at 0, where each float vector lies (`PolicyConfig.with_vector_widths`), and the cameras' frame shapes (`PolicyConfig.with_frame_shapes`), so the saved
    config.json rebuilds the same policy without the data. (A dataset gives cameras only to a policy
    that asks for them: ACT's default `observation.images.*`, or named ones.)"""
    check_history(config, dataset)
    features = list(dataset.input_features)
    fitted = dataclasses.replace(
        config.with_vector_widths(dataset.vector_widths),
        input_features=features,
        obs_dim=config.obs_dim or dataset.obs_dim,
        action_dim=config.action_dim or dataset.action_dim,
    )
    seen = [name for name in features if is_camera(name)]
    if not seen:
        return fitted
    batch = dataset.gather(torch.zeros(1, dtype=torch.long), 1)
    return fitted.with_frame_shapes({name: list(batch[name].shape[1:]) for name in seen})


def check_history(config: PolicyConfig, dataset: Dataset) -> None:
    """Refuse an observation history longer than every episode: each sample would pad it with its
    episode's first frame (as LeRobot's dataset silently does), so the policy never sees one of its own."""
    frames = config.frames
    if not frames.history:
        return
    span = max(frames.observation) - min(frames.observation) + 1
    bounds = dataset.episode_bounds()
    longest = int((bounds[:, 1] - bounds[:, 0]).max()) if len(bounds) else 0
    if span > longest:
        raise ConfigError(
            f"the policy reads {span} observation frames per sample (--policy.n_obs_steps), more than the "
            f"longest episode of the dataset holds ({longest} frames): no sample would see a history of its "
            f"own; lower --policy.n_obs_steps to at most {longest}"
        )


def register_import_path(type_name: str) -> None:
    """Make `--policy.type=package.module:ConfigClass` usable (config/registry.py)."""
    registry.register_import_path(PolicyConfig, type_name, "--policy.type")


def known_types() -> list[str]:
    return registry.known_types(PolicyConfig)
