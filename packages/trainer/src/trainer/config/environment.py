"""Environments a policy is scored in (`--env.*`) and how it is scored (`--eval.*`): LeRobot's names.

`--env.type` picks an environment config as lerobot-train 0.6.1 spells it: `pusht` (gym-pusht) and
`aloha` (gym-aloha) with LeRobot's fields, defaults and feature names; `pendulum`, the embedded task this
trainer's demonstrations come from (`--env.camera=true`: its camera variant); `gym`, any gymnasium id
with a map from its observation keys to the policy's feature names. Plain values: the environments
themselves are built by evaluation/environments.py, in the evaluator process (docs/evaluation.md).

`--eval.*` is LeRobot's EvalConfig (episodes, vectorized environments) and what the evaluator beside a
training run needs besides (its device and cores, the per-episode time limit, the videos, whether the
run's end waits for the last score). LeRobot's recording of rollouts as a dataset is refused.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import draccus

from trainer.errors import ConfigError

STATE, VISUAL, ENV, ACTION = "STATE", "VISUAL", "ENV", "ACTION"
"""LeRobot's FeatureType names, as its env configs store them."""


@dataclass
class EnvFeature:
    """One feature an environment gives or takes (LeRobot's PolicyFeature): its kind and its shape as
    the environment gives it (a camera's H, W, C)."""

    type: str = STATE
    shape: tuple[int, ...] = ()


@dataclass
class EnvConfig(draccus.ChoiceRegistry):
    """Base of every environment config; `--env.type` picks the subclass. The fields are LeRobot's
    EnvConfig's."""

    task: str | None = None
    """The environment's gymnasium id inside its package (`PushT-v0`), or a whole id for `gym`."""
    fps: int = 30
    """Frames per second of the environment (its videos play at this rate)."""
    features: dict[str, EnvFeature] = field(default_factory=dict)
    """The environment's features by its own keys (LeRobot's names; filled by each type)."""
    features_map: dict[str, str] = field(default_factory=dict)
    """Environment key -> the feature name a policy reads it as (`pixels` -> `observation.image`); a
    nested key is written `pixels/top`."""
    max_parallel_tasks: int = 1
    """LeRobot's tasks evaluated at once in a multi-task suite; these environments have one task."""
    disable_env_checker: bool = True
    """Skip gymnasium's environment checker (LeRobot's default)."""

    def __post_init__(self) -> None:
        if self.max_parallel_tasks != 1:
            raise ConfigError(
                f"--env.max_parallel_tasks={self.max_parallel_tasks}: the environments here have one task "
                "each; drop the flag (it is LeRobot's, for multi-task suites)"
            )
        if self.fps < 1:
            raise ConfigError(f"--env.fps must be >= 1, got {self.fps}")

    @property
    def type(self) -> str:
        return self.get_choice_name(type(self))

    @property
    def package(self) -> str | None:
        """The module that registers the environment with gymnasium (imported first), if any."""
        return f"gym_{self.type}"

    @property
    def gym_id(self) -> str:
        """What `gymnasium.make` is given."""
        return f"{self.package}/{self.task}"

    @property
    def episode_steps(self) -> int:
        """The most steps an episode takes (its time limit in steps)."""
        raise NotImplementedError

    def gym_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of `gymnasium.make`."""
        return {"max_episode_steps": self.episode_steps}

    def install_hint(self) -> str:
        """How to install the environment when its package is missing."""
        return f"pip install 'ckpt-trainer[{self.type}]'"


@EnvConfig.register_subclass("pusht")
@dataclass
class PushtEnv(EnvConfig):
    """gym-pusht's PushT (LeRobot's PushtEnv): push the T onto its target, 96x96 pixels and the agent's
    position by default as LeRobot's datasets record them."""

    task: str | None = "PushT-v0"
    fps: int = 10
    episode_length: int = 300
    obs_type: str = "pixels_agent_pos"
    """pixels_agent_pos (camera + agent position), environment_state_agent_pos or pixels."""
    render_mode: str = "rgb_array"
    visualization_width: int = 384
    visualization_height: int = 384
    observation_height: int = 384
    observation_width: int = 384
    features: dict[str, EnvFeature] = field(
        default_factory=lambda: {"action": EnvFeature(ACTION, (2,)), "agent_pos": EnvFeature(STATE, (2,))}
    )
    features_map: dict[str, str] = field(
        default_factory=lambda: {
            "action": "action",
            "agent_pos": "observation.state",
            "environment_state": "observation.environment_state",
            "pixels": "observation.image",
        }
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.obs_type == "pixels_agent_pos":
            shape = (self.observation_height, self.observation_width, 3)
            self.features["pixels"] = EnvFeature(VISUAL, shape)
        elif self.obs_type == "environment_state_agent_pos":
            self.features["environment_state"] = EnvFeature(ENV, (16,))

    @property
    def episode_steps(self) -> int:
        return self.episode_length

    def gym_kwargs(self) -> dict[str, Any]:
        return {
            "obs_type": self.obs_type,
            "render_mode": self.render_mode,
            "visualization_width": self.visualization_width,
            "visualization_height": self.visualization_height,
            "max_episode_steps": self.episode_length,
        }


@EnvConfig.register_subclass("aloha")
@dataclass
class AlohaEnv(EnvConfig):
    """gym-aloha's bimanual tasks in MuJoCo (LeRobot's AlohaEnv): insertion or cube transfer, the top
    camera at 480x640 and the 14 joint positions. Without a display set MUJOCO_GL=egl."""

    task: str | None = "AlohaInsertion-v0"
    fps: int = 50
    episode_length: int = 400
    obs_type: str = "pixels_agent_pos"
    """pixels_agent_pos (camera + joint positions) or pixels."""
    observation_height: int = 480
    observation_width: int = 640
    render_mode: str = "rgb_array"
    features: dict[str, EnvFeature] = field(default_factory=lambda: {"action": EnvFeature(ACTION, (14,))})
    features_map: dict[str, str] = field(
        default_factory=lambda: {
            "action": "action",
            "agent_pos": "observation.state",
            "top": "observation.image.top",
            "pixels/top": "observation.images.top",
        }
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        shape = (self.observation_height, self.observation_width, 3)
        if self.obs_type == "pixels":
            self.features["top"] = EnvFeature(VISUAL, shape)
        elif self.obs_type == "pixels_agent_pos":
            self.features["agent_pos"] = EnvFeature(STATE, (14,))
            self.features["pixels/top"] = EnvFeature(VISUAL, shape)

    @property
    def episode_steps(self) -> int:
        return self.episode_length

    def gym_kwargs(self) -> dict[str, Any]:
        return {
            "obs_type": self.obs_type,
            "render_mode": self.render_mode,
            "max_episode_steps": self.episode_length,
        }


@EnvConfig.register_subclass("pendulum")
@dataclass
class PendulumEnv(EnvConfig):
    """The embedded pendulum task (data/embedded/sim.py), the one `--dataset.type=pendulum` records:
    swing up and hold, or with `--env.camera=true` reach the target seen only in the camera frame.
    Success: the episode ends with the rod within 0.3 rad of its goal, turning slower than 1 rad/s."""

    task: str | None = "Pendulum-v0"
    fps: int = 20
    camera: bool = False
    """The camera variant: `observation.images.top` shows the target the rod must reach."""
    features: dict[str, EnvFeature] = field(
        default_factory=lambda: {"action": EnvFeature(ACTION, (1,)), "agent_pos": EnvFeature(STATE, (3,))}
    )
    features_map: dict[str, str] = field(
        default_factory=lambda: {
            "action": "action",
            "agent_pos": "observation.state",
            "pixels/top": "observation.images.top",
        }
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.camera:
            self.features["pixels/top"] = EnvFeature(VISUAL, (32, 32, 3))

    @property
    def package(self) -> str | None:
        return "trainer.evaluation.pendulum_env"

    @property
    def gym_id(self) -> str:
        return f"{self.package}:trainer/{'PendulumCamera-v0' if self.camera else self.task}"

    @property
    def episode_steps(self) -> int:
        return 100 if self.camera else 200

    def install_hint(self) -> str:
        return "it ships with the trainer: reinstall ckpt-trainer"


@EnvConfig.register_subclass("gym")
@dataclass
class GymEnv(EnvConfig):
    """Any gymnasium environment: `--env.task` is its id (`module:Name-v0` imports the module that
    registers it), `--env.features_map` names what the policy reads (an array observation is the key
    `observation`, a dict's keys are its own, `pixels/top` for a nested one)."""

    episode_length: int = 1000
    """The most steps of an episode (gymnasium's max_episode_steps)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """More keyword arguments of gymnasium.make, as a JSON object."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.task:
            raise ConfigError("--env.type=gym needs --env.task=ID (a gymnasium id, or module:Name-v0)")
        if not self.features_map:
            raise ConfigError(
                '--env.type=gym needs --env.features_map={"observation": "observation.state", ...}: '
                "which observation key the policy reads as which feature"
            )

    @property
    def package(self) -> str | None:
        return self.task.partition(":")[0] if self.task and ":" in self.task else None

    @property
    def gym_id(self) -> str:
        return self.task or ""

    @property
    def episode_steps(self) -> int:
        return self.episode_length

    def gym_kwargs(self) -> dict[str, Any]:
        return {**self.kwargs, "max_episode_steps": self.episode_length}

    def install_hint(self) -> str:
        return f"install the package that registers {self.task}"


def check_installed(config: EnvConfig) -> None:
    """An environment whose package is missing is one line when the run starts, not a failed score
    per checkpoint later (found without importing it)."""
    import importlib.util

    package = config.package
    if package is None:
        return
    try:
        found = importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ConfigError(
            f"--env.type={config.type} needs the module {package}, which is not installed: {config.install_hint()}"
        )


REFUSED = "recording evaluation rollouts as a dataset (LeRobot's --eval.recording) is not built"


@dataclass
class EnvEvalConfig:
    """`--eval.*`: LeRobot's EvalConfig fields, and this trainer's evaluator settings."""

    n_episodes: int = 50
    """Episodes per evaluation of one checkpoint."""
    batch_size: int = 0
    """Environments stepped together (a gymnasium vector environment); 0: min(70% of the cores the
    evaluator may use, n_episodes, 64), as LeRobot picks."""
    use_async_envs: bool = True
    """Each environment in its own process (AsyncVectorEnv; one environment runs in the evaluator)."""
    recording: bool = False
    """LeRobot's recording of the rollouts as a dataset: refused (not built)."""
    recording_repo_id: str | None = None
    """LeRobot's Hub repo of recorded rollouts: refused (not built)."""
    recording_private: bool = False
    """LeRobot's privacy of that repo: refused (not built)."""
    device: str = "cpu"
    """Where the evaluator runs the policy (cpu, cuda, cuda:1): a device the training ranks do not use
    keeps evaluation from slowing training."""
    cpus: list[int] | None = None
    """The CPU cores the evaluator (and its environment processes) may run on, e.g. [7]; unset: any."""
    threads: int = 1
    """Torch threads of the evaluator's policy."""
    episode_time_limit_s: float = 600.0
    """Seconds an episode may take before that checkpoint's evaluation is given up (one line; the
    other checkpoints and the run go on)."""
    max_episodes_rendered: int = 4
    """Episodes written as mp4 videos beside each score (0: none)."""
    wait_at_end: bool = False
    """The run's end waits until its last checkpoint is scored (and logs it); otherwise the evaluator
    finishes the committed checkpoints in the background and the run ends at once."""

    def __post_init__(self) -> None:
        if self.recording or self.recording_repo_id is not None or self.recording_private:
            flag = (
                "recording"
                if self.recording
                else "recording_repo_id"
                if self.recording_repo_id
                else "recording_private"
            )
            raise ConfigError(f"--eval.{flag}: {REFUSED}; scores and videos land in each step's eval.json")
        for name in ("n_episodes", "threads"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--eval.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("batch_size", "max_episodes_rendered"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--eval.{name} must be >= 0, got {getattr(self, name)}")
        if not self.episode_time_limit_s > 0:
            raise ConfigError(f"--eval.episode_time_limit_s must be > 0, got {self.episode_time_limit_s}")

    def environments(self) -> int:
        """The vector environment's size: `batch_size`, or LeRobot's automatic choice."""
        if self.batch_size:
            return min(self.batch_size, self.n_episodes)
        cores = len(self.cpus) if self.cpus else os.cpu_count() or 4
        return min(max(1, math.floor(cores * 0.7)), self.n_episodes, 64)
