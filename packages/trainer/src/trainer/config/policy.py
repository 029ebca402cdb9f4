"""The base of every policy config (`--policy.type` picks the subclass) and its common fields.

A config module holds plain values: the policy classes live in `trainer/policies/`, where each built-in
type registers its config subclass; `policy_class()` names the class a config builds and
`lerobot_adapter()` its LeRobot form (`LeRobotAdapter`, declared at the end of this module).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

import draccus

from trainer.config.accelerator import dtype_flag
from trainer.config.dataset import Embodiment, FrameResize, Frames
from trainer.config.optim import AdamWConfig, CosineConfig, OptimizerConfig, SchedulerConfig
from trainer.errors import ConfigError

if TYPE_CHECKING:
    import torch
    from torch import nn

ProcessorFiles = tuple[
    dict[str, Any], list[dict[str, "torch.Tensor"]]
]  # a processor's JSON, tensors per step


class ProcessorSchema(Protocol):
    """A policy's normalizer and unnormalizer written as another tool builds them (LeRobot's pipeline:
    `data/pipeline/lerobot_schema.LeRobotPipeline`), from our per-key mean/std. Declared here, with the
    adapter that returns it (`LeRobotAdapter.pipeline`), so the config layer names no data-layer class."""

    def preprocessor(self, stats: dict[str, dict[str, torch.Tensor]]) -> ProcessorFiles: ...

    def postprocessor(self, stats: dict[str, dict[str, torch.Tensor]]) -> ProcessorFiles: ...


# PolicyConfig fields that say where (and under which license and tags) a run publishes, not what the policy is.
PUBLISH_FIELDS = ("push_to_hub", "repo_id", "private", "license", "tags")
# Fields of the run, not of the policy: kept out of config.json like the publish settings.
RUN_FIELDS = (*PUBLISH_FIELDS, "device")
DEVICES = ("auto", "cpu", "cuda", "mps")
# LeRobot's policy config.json fields that say nothing about the model (its run settings, RTC, PEFT flags):
# read and dropped, written back with LeRobot's defaults.
LEROBOT_RUN_FIELDS: dict[str, Any] = {
    "use_amp": False,
    "use_peft": False,
    "push_to_hub": False,
    "repo_id": None,
    "private": None,
    "tags": None,
    "license": None,
    "pretrained_path": None,
    "pretrained_revision": None,
}


@dataclass
class PolicyConfig(draccus.ChoiceRegistry):
    """Base of every policy config; `--policy.type` picks the subclass."""

    # Fields naming a local file or directory (or a Hub repo id): an existing local path is recorded
    # absolute when a run's config is parsed, so the checkpoint loads from any working directory.
    path_fields: ClassVar[tuple[str, ...]] = ()

    dropout: float = 0.1
    """Dropout probability inside the policy (0 makes a run deterministic across topologies)."""
    dtype: str | None = None
    """Cast the policy's parameters to this dtype (float32, bfloat16, float16, or fp32, bf16, fp16);
    autocast stays owned by --accelerator.mixed_precision."""
    obs_dim: int = 0
    """Observation size; 0 takes it from the dataset (the saved config.json records the value)."""
    action_dim: int = 0
    """Action size; 0 takes it from the dataset."""
    input_features: list[str] = field(default_factory=list)
    """Observation features the policy reads: float vectors, concatenated in this order into
    `observation.state`, and cameras (`observation.images.<name>`, for policies that see); empty takes
    every one the dataset provides in its metadata's order (config.json records the list)."""
    path: str | None = None
    """Start from this pretrained policy: a local model or step directory, or a Hub repo id (its
    config.json supplies the other policy fields; flags still override them)."""
    push_to_hub: bool = False
    """Publish the final checkpoint's model, processors, configs and a model card to --policy.repo_id
    at the end of training (docs/publishing.md)."""
    repo_id: str | None = None
    """Hub repo (`namespace/name`) or fsspec target (`s3://bucket/prefix`, a local path) to publish to."""
    private: bool = False
    """Create the Hub repo private (an existing repo keeps its visibility)."""
    license: str | None = None
    """The license the published model card declares (LeRobot's field; a Hub license id such as
    apache-2.0 or mit); unset leaves it out."""
    tags: list[str] | None = None
    """Tags the published model card adds to its own (LeRobot's field)."""
    device: str | None = None
    """LeRobot's device flag (auto, cpu, cuda, mps): the launch decides the device (every rank its GPU,
    else the CPU), so a value that disagrees with it is refused rather than ignored."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"--policy.dropout must be in [0, 1), got {self.dropout}")
        self.dtype = dtype_flag("--policy.dtype", self.dtype)
        if self.device is not None and self.device not in DEVICES:
            raise ConfigError(f"--policy.device={self.device!r} is not one of {', '.join(DEVICES)}")
        if self.push_to_hub and not self.repo_id:
            raise ConfigError(
                "--policy.push_to_hub=true needs --policy.repo_id=namespace/name (or an fsspec URL)"
            )

    @property
    def type(self) -> str:
        return self.get_choice_name(type(self))

    def with_frame_shapes(self, shapes: dict[str, list[int]]) -> PolicyConfig:
        """This config for cameras of these frame shapes (C, H, W) by feature (a policy that sees
        records them, and refuses shapes other than those it was trained on)."""
        return self

    def with_vector_widths(self, widths: dict[str, int]) -> PolicyConfig:
        """This config for the data's float vectors of these widths (`Dataset.vector_widths`, in the
        order they are concatenated), called before the sizes left at 0 are filled: a policy that
        reads one of them on its own records where it lies in `observation.state`."""
        return self

    def data_note(self) -> str | None:
        """A line for the run's start banner when the model built for this data is not the one
        LeRobot builds from the same flags; None when it is."""
        return None

    @property
    def chunk_size(self) -> int:
        """Actions predicted per observation."""
        return 1

    @property
    def observation_delta_indices(self) -> list[int] | None:
        """The observation frames the policy reads, in frames from the sample (LeRobot's name and
        meaning: -1 is the frame before; None, the default, is the current frame alone). The data layer
        delivers them with `<key>_is_pad` for every source (local, streamed, mixtures) and in workers."""
        return None

    @property
    def action_delta_indices(self) -> list[int]:
        """The action frames the policy is trained on (LeRobot's name): by default the chunk that
        starts at the sample, `range(chunk_size)`."""
        return list(range(self.chunk_size))

    @property
    def drop_n_last_frames(self) -> int:
        """Frames at the end of every episode never drawn as training samples (LeRobot's name: its
        episode-aware sampler's; Diffusion Policy drops 7 so that its action chunks rarely run past an
        episode's end). They are still read as the observations and actions around other samples."""
        return 0

    @property
    def takes_mixed_members(self) -> bool:
        """Whether the policy trains on a mixture whose members differ in state or action size, cameras or
        fps (data/sources/mixture.py): it reads each item's state and action padded to the widest member
        with `*_dim_is_pad` masks and a camera a member lacks as an empty slot (`<camera>_padding_mask`).
        False by default: ACT and the MLPs read one fixed layout, so members must agree. Each member is
        then an embodiment (`config.dataset.Embodiment`), normalized by its own statistics."""
        return False

    @property
    def pads_mixed_members(self) -> bool:
        """Whether the members it takes may differ in state and action sizes and cameras too (padded,
        masked: SmolVLA), or in fps and statistics only (False: a policy of one layout, Diffusion
        Policy, whose members must agree on every size and camera). Default: `takes_mixed_members`."""
        return self.takes_mixed_members

    def frame_resize(self) -> FrameResize | None:
        """How the policy brings every camera frame to its own input size before reading it, when that
        equals doing it in the data (cameras normalized IDENTITY): SmolVLA's and pi0/pi0.5's resize
        with padding. A mixture whose members record one camera at different sizes is then served
        through it (data/pipeline/resized.py); None (the default, ACT, Diffusion Policy, the MLPs):
        the policy reads frames at their recorded size, so such a mixture is refused."""
        return None

    def for_embodiment(self, embodiment: Embodiment) -> PolicyConfig:
        """This config for one robot of the mixture it was trained on (`load_policy(embodiment=)`,
        `trainer export --embodiment`): that robot's state and action sizes and the input features it
        has, so the policy acts on its raw observations and its export describes it. The weights must
        not depend on those sizes (a padding policy's do not): `load_policy` checks them against the
        config it returns."""
        features = [name for name in self.input_features if name in embodiment.input_features]
        return dataclasses.replace(
            self, obs_dim=embodiment.obs_dim, action_dim=embodiment.action_dim, input_features=features
        )

    @property
    def frames(self) -> Frames:
        """Both offsets as the data layer takes them (`config.dataset.Frames`)."""
        return Frames(tuple(self.observation_delta_indices or (0,)), tuple(self.action_delta_indices))

    def get_optimizer_preset(self) -> OptimizerConfig:
        """The optimizer this policy trains with under --use_policy_training_preset=true (LeRobot's
        method name), built from the config's own fields so `--policy.<field>` flags change it; this
        base returns the engine's defaults (AdamW lr 2e-3, weight decay 1e-4, clip 10)."""
        return AdamWConfig()

    def get_scheduler_preset(self) -> SchedulerConfig:
        """The schedule under --use_policy_training_preset=true; LeRobot's "no scheduler" (None) is
        `ConstantConfig(warmup_steps=0)` here. This base returns the engine's default cosine."""
        return CosineConfig()

    @property
    def cast_dtype(self) -> str | None:
        """The dtype `build_policy` casts every parameter to: `--policy.dtype` by default; None for a
        policy that places its own dtypes (pi0's bfloat16 keeps the vision tower and the norms in
        float32, as LeRobot does)."""
        return self.dtype

    def policy_class(self) -> Callable[[PolicyConfig], nn.Module]:
        """The class this config builds, called with the config (`trainer.policies.Policy` subclasses;
        `build_policy` refuses anything else). A built-in policy imports it here, when a policy is
        built: its policy module imports the config, so the config module cannot import it on top."""
        raise NotImplementedError

    def normalization_stats(self, stats: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """The statistics the processors normalize with, from the dataset's (a policy whose cameras
        stay on [0, 1], SmolVLA's, replaces theirs with mean 0 and std 1)."""
        return stats

    @classmethod
    def lerobot_adapter(cls) -> LeRobotAdapter[Any] | None:
        """This policy's LeRobot form (`LeRobotAdapter`, in the policy's folder: `<policy>/lerobot.py`,
        imported here when asked for); None, this base, for a policy LeRobot lacks: its checkpoints keep
        our schema alone and `trainer export` refuses it in one line."""
        return None

    def to_dict(self) -> dict[str, Any]:
        """The policy's `config.json`: its type and every field but the run's settings (publishing,
        device), which belong to train_config.json: a run started from a published model with --policy.path must
        not publish over that model's repo."""
        fields = dataclasses.asdict(self)
        for name in RUN_FIELDS:
            fields.pop(name)
        return {"type": self.type, **fields}


Config = TypeVar("Config", bound=PolicyConfig)


class LeRobotAdapter(abc.ABC, Generic[Config]):
    """One policy's LeRobot form, both ways (torchtitan's `StateDictAdapter` for LeRobot 0.6.1): its
    config.json schema, its tensor names, its processor pipeline, and the flags a `--policy.path` base
    cannot follow. A policy config returns one from `PolicyConfig.lerobot_adapter()`; declared here so
    the config layer names no policy class. The tensor hooks default to LeRobot's names being ours (SmolVLA,
    Diffusion Policy); the rest of the engine never asks which policy it holds."""

    def config_from_lerobot(
        self, saved: dict[str, Any], preprocessor: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """A saved config.json of this type as the config's fields: LeRobot's schema mapped, ours as it
        is. `preprocessor` is the checkpoint's `policy_preprocessor.json` when it has one: LeRobot
        records some of a policy's settings there only (pi0's tokenizer)."""
        return saved

    @abc.abstractmethod
    def config_to_lerobot(self, config: Config) -> dict[str, Any]:
        """`config` as LeRobot's config.json of the same policy (`trainer export`); a config LeRobot's
        policy cannot express is one line (ConfigError)."""

    @abc.abstractmethod
    def pipeline(self, config: Config) -> ProcessorSchema:
        """The processors in LeRobot's pipeline schema, as its factory builds them for the same policy
        (every checkpoint of such a policy saves them so; docs/format.md)."""

    def check_path_flags(self, base: dict[str, Any], flags: dict[str, str], path: str) -> None:
        """Refuse `--policy.<field>` flags (`flags`: field -> value) that a `--policy.path` base's
        weights cannot follow (SmolVLA: another backbone); raises ConfigError."""

    def is_lerobot_state(self, names: Collection[str]) -> bool:
        """Whether tensor `names` (a checkpoint's, read from its headers alone) are LeRobot's rather
        than ours, so that `state_from_lerobot` must rename them."""
        return False

    def state_from_lerobot(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """LeRobot's weights (`is_lerobot_state`) under our tensor names."""
        return state

    def names_from_lerobot(self, names: Collection[str]) -> dict[str, str] | None:
        """For LeRobot's tensor `names`: each tensor `state_from_lerobot` makes, by our name -> the saved
        name it is read from, when it only renames and drops tensors (pi's paired decoder layers): the
        weights then stream into a meta-built policy's shards name by name. None when it does more
        (ACT: fused projections split): the policy is then built whole and reads them whole."""
        return None

    def state_to_lerobot(self, config: Config, policy: nn.Module) -> dict[str, torch.Tensor]:
        """`policy`'s weights under LeRobot's tensor names and shapes, as its
        `from_pretrained(strict=True)` reads them (`trainer export`)."""
        return policy.state_dict()

    def tensors_to_lerobot(self, config: Config, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Per-weight tensors under our names (one kind of an optimizer's state: AdamW's `exp_avg`) under
        LeRobot's policy-level names and shapes, as `state_to_lerobot` maps the weights they belong to
        (`trainer export --lerobot_step`)."""
        return tensors

    def lerobot_param_groups(
        self, config: Config, names: list[str]
    ) -> list[tuple[list[str], dict[str, Any]]] | None:
        """LeRobot's optimizer param groups over its trained parameters `names` (LeRobot's names), as its
        policy's `get_optim_params` makes them: each group's names and the hyperparameters it sets apart
        (ACT's backbone rate). None, this base: the policy's optimizer has no LeRobot main form here, and
        `trainer export --lerobot_step` refuses it in one line."""
        return None
