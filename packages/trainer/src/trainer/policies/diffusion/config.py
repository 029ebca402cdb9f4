"""LeRobot 0.6.1's Diffusion Policy configuration: its flag names, defaults and checks.

A LeRobot user's `lerobot-train --policy.type=diffusion ...` flags mean the same here, and a LeRobot
config.json reads back through its adapter (`lerobot.py`) (its feature shapes through `DiffusionFeatures.from_lerobot`).
Where LeRobot would fail late (a shape error inside the U-Net) or silently (an ignored crop), the
config refuses up front, one line naming the flag.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from trainer.config import registry
from trainer.config.optim import AdamConfig, CosineConfig
from trainer.config.policy import LeRobotAdapter, PolicyConfig
from trainer.data.dataset import ACTION_KEY, ALL_CAMERAS, ENV_KEY, OBS_KEY, is_camera
from trainer.data.pipeline.normalization import NORMALIZATION_MODES, feature_type, mapped_stats
from trainer.errors import ConfigError
from trainer.policies.common import resnet

if TYPE_CHECKING:
    from trainer.policies.common.base import Policy

NOISE_SCHEDULERS = ("DDPM", "DDIM")
PREDICTION_TYPES = ("epsilon", "sample")
# diffusers' DDPMScheduler/DDIMScheduler beta schedules (any other raises deep inside diffusers).
BETA_SCHEDULES = ("linear", "scaled_linear", "squaredcos_cap_v2", "sigmoid")
FINAL_CONV_GROUPS = 8  # LeRobot's final_conv GroupNorm: 8 groups whatever --policy.n_groups says


@dataclass
class DiffusionFeatures:
    """The feature shapes a Diffusion Policy is built for (the dataset's, or a checkpoint's config.json)."""

    state_dim: int
    action_dim: int
    cameras: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    """(C, H, W) per camera, in the order their features enter the conditioning."""
    env_state_dim: int = 0
    """`observation.environment_state`'s width (0: none); conditions after the cameras, as in LeRobot."""

    @classmethod
    def from_lerobot(cls, saved: dict[str, Any]) -> DiffusionFeatures:
        """The shapes in a LeRobot config.json's `input_features`/`output_features`."""
        inputs, outputs = saved.get("input_features") or {}, saved.get("output_features") or {}

        def width(feature: Any) -> int:
            return int(feature["shape"][0]) if isinstance(feature, dict) and feature.get("shape") else 0

        cameras = {
            name: (int(f["shape"][0]), int(f["shape"][1]), int(f["shape"][2]))
            for name, f in inputs.items()
            if isinstance(f, dict) and f.get("type") == "VISUAL"
        }
        return cls(
            state_dim=width(inputs.get(OBS_KEY)),
            action_dim=width(outputs.get(ACTION_KEY)),
            cameras=cameras,
            env_state_dim=width(inputs.get(ENV_KEY)),
        )


@PolicyConfig.register_subclass("diffusion")
@dataclass
class DiffusionConfig(PolicyConfig):
    """LeRobot's Diffusion Policy: a 1-D U-Net denoising an action chunk, conditioned by FiLM on the
    recent observations (state and ResNet keypoint features of every camera)."""

    n_obs_steps: int = 2
    """Observation steps the policy conditions on (the current one and those before it)."""
    horizon: int = 64
    """Actions denoised per chunk, starting at the oldest observation step."""
    n_action_steps: int = 32
    """Actions of each chunk executed, from the current step on (<= horizon - n_obs_steps + 1)."""
    normalization_mapping: dict[str, str] = field(
        default_factory=lambda: {"VISUAL": "MEAN_STD", "STATE": "MIN_MAX", "ACTION": "MIN_MAX"}
    )
    """How each feature type is normalized (LeRobot's: cameras by mean/std, state and action to [-1, 1])."""
    drop_n_last_frames: int = 7  # a field here, a property on the base
    """Frames at the end of each episode never sampled for training (LeRobot's episode-aware sampler)."""
    vision_backbone: str = "resnet18"
    """Camera trunk: resnet18 or resnet34."""
    resize_shape: tuple[int, int] | None = None
    """(H, W) every frame is resized to (antialiased bilinear) before the crop; None keeps its size."""
    crop_ratio: float = 1.0
    """With resize_shape: the crop is int(resize_shape * crop_ratio) per side (1.0: no crop)."""
    crop_shape: tuple[int, int] | None = None
    """(H, W) crop without resize_shape (with it, derived from crop_ratio); None: no crop."""
    crop_is_random: bool = True
    """Random crop position in training (the centre in evaluation, always)."""
    pretrained_backbone_weights: str | None = "ResNet18_Weights.IMAGENET1K_V1"
    """The trunk's starting weights: a torchvision weight name, a Hub repo id or a safetensors file;
    None trains it from scratch."""
    use_group_norm: bool = False
    """Group norm (channels // 16 groups) instead of batch norm in the trunk (needs no pretrained weights)."""
    spatial_softmax_num_keypoints: int = 32
    """Keypoints per camera (each an expected (x, y) position over the trunk's feature map)."""
    use_separate_rgb_encoder_per_camera: bool = True
    """One encoder (trunk, keypoints, projection) per camera; false shares one by all cameras."""
    down_dims: tuple[int, ...] = (512, 1024, 2048)
    """Channels of the U-Net's levels (each level after the first halves the time resolution)."""
    kernel_size: int = 5
    """Temporal kernel of the U-Net's convolutions (odd)."""
    n_groups: int = 8
    """GroupNorm groups in the U-Net's blocks."""
    diffusion_step_embed_dim: int = 128
    """Width of the diffusion timestep's embedding."""
    use_film_scale_modulation: bool = True
    """FiLM conditioning scales and shifts each channel (false: shifts only)."""
    gradient_checkpointing: bool = False
    """Recompute the U-Net's residual blocks in the backward pass (less activation memory)."""
    noise_scheduler_type: str = "DDPM"
    """DDPM or DDIM (diffusers' schedulers)."""
    num_train_timesteps: int = 100
    """Diffusion steps of the forward (noising) process."""
    beta_schedule: str = "squaredcos_cap_v2"
    """diffusers' beta schedule: linear, scaled_linear, squaredcos_cap_v2 or sigmoid."""
    beta_start: float = 0.0001
    """First beta (the linear-type schedules; unused by squaredcos_cap_v2)."""
    beta_end: float = 0.02
    """Last beta (the linear-type schedules)."""
    prediction_type: str = "epsilon"
    """What the U-Net predicts: epsilon (the noise) or sample (the clean actions)."""
    clip_sample: bool = True
    """Clip each denoising step's clean-action estimate to +-clip_sample_range."""
    clip_sample_range: float = 1.0
    """The clipping bound (normalized actions lie in [-1, 1] under MIN_MAX)."""
    num_inference_steps: int | None = None
    """Denoising steps when sampling; None: num_train_timesteps."""
    compile_model: bool = False
    """LeRobot's torch.compile switch (use --accelerator.compile here: must stay false)."""
    compile_mode: str = "reduce-overhead"
    """LeRobot's torch.compile mode (kept for its config.json)."""
    do_mask_loss_for_padding: bool = False
    """Leave the actions padded past an episode's end out of the loss (LeRobot's default counts them)."""
    optimizer_lr: float = 1e-4
    """Learning rate of the training preset (--use_policy_training_preset=true): Adam, cosine schedule."""
    optimizer_betas: tuple[float, float] = (0.95, 0.999)
    """The preset's Adam betas."""
    optimizer_eps: float = 1e-8
    """The preset's Adam epsilon."""
    optimizer_weight_decay: float = 1e-6
    """The preset's Adam (L2) weight decay."""
    scheduler_name: str = "cosine"
    """The preset's schedule (cosine: the only one supported here)."""
    scheduler_warmup_steps: int = 500
    """The preset's linear warmup steps."""
    input_features: list[str] = field(default_factory=lambda: [ALL_CAMERAS])
    """Observation features: float vectors, concatenated in this order into `observation.state`, and
    cameras (`observation.images.*`: every camera of the dataset, beside every float vector when none
    is named); config.json records the resolved list."""
    image_shapes: dict[str, list[int]] = field(default_factory=dict)
    """Frame shape (C, H, W) of each camera, taken from the dataset (config.json records it; frames of
    another shape are refused)."""
    env_state_dim: int = 0
    """Width of LeRobot's `observation.environment_state` at the end of `observation.state` (listed last
    among the float vectors of input_features): conditions after the camera features and is left
    unnormalized, as in LeRobot; 0 reads every vector as the robot state. Set from a LeRobot
    checkpoint's config.json."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self._normalize_types()
        _refuse([
            (self.resize_shape is None or (len(self.resize_shape) == 2 and min(self.resize_shape) > 0), f"--policy.resize_shape={self._shown(self.resize_shape)} must be a pair of positive integers (H, W)"),
            (0 < self.crop_ratio <= 1, f"--policy.crop_ratio={self.crop_ratio} must be in (0, 1]"),
        ])  # fmt: skip
        self._derive_crop_shape()
        factor = 2 ** len(self.down_dims)
        _refuse([
            (self.vision_backbone in resnet.BLOCKS, f"--policy.vision_backbone={self.vision_backbone!r}: choose resnet18 or resnet34 (the plain-torch trunk builds the BasicBlock ResNets only; LeRobot also takes deeper torchvision ones)"),
            (self.noise_scheduler_type in NOISE_SCHEDULERS, f"--policy.noise_scheduler_type={self.noise_scheduler_type!r}: choose DDPM or DDIM"),
            (self.prediction_type in PREDICTION_TYPES, f"--policy.prediction_type={self.prediction_type!r}: choose epsilon or sample"),
            (self.beta_schedule in BETA_SCHEDULES, f"--policy.beta_schedule={self.beta_schedule!r}: choose one of {', '.join(BETA_SCHEDULES)}"),
            (self.n_obs_steps >= 1, f"--policy.n_obs_steps={self.n_obs_steps} must be >= 1"),
            (len(self.down_dims) >= 1, "--policy.down_dims must name at least one level"),
            (self.horizon >= 1 and self.horizon % factor == 0, f"--policy.horizon={self.horizon} must be a multiple of {factor} (2 ** len(--policy.down_dims), LeRobot's rule for {len(self.down_dims)} U-Net levels)"),
            (1 <= self.n_action_steps <= self.horizon - self.n_obs_steps + 1, f"--policy.n_action_steps={self.n_action_steps} must be in [1, horizon - n_obs_steps + 1 = {self.horizon - self.n_obs_steps + 1}]: a chunk holds no more actions from the current step on"),
            (self.kernel_size >= 1 and self.kernel_size % 2 == 1, f"--policy.kernel_size={self.kernel_size} must be odd (the U-Net pads k // 2 on each side)"),
            (all(d > 0 and d % self.n_groups == 0 and d % FINAL_CONV_GROUPS == 0 for d in self.down_dims) if self.n_groups >= 1 else False, f"--policy.down_dims={list(self.down_dims)}: each must be a multiple of --policy.n_groups={self.n_groups} and of 8 (the GroupNorm groups)"),
            (self.crop_shape is None or (len(self.crop_shape) == 2 and min(self.crop_shape) > 0), f"--policy.crop_shape={self._shown(self.crop_shape)} must be a pair of positive integers (H, W)"),
            (not (self.use_group_norm and self.pretrained_backbone_weights), "--policy.use_group_norm=true replaces the trunk's batch norm, which pretrained weights need: set --policy.pretrained_backbone_weights=null"),
            (self.spatial_softmax_num_keypoints >= 1 and self.diffusion_step_embed_dim >= 2, "--policy.spatial_softmax_num_keypoints must be >= 1 and --policy.diffusion_step_embed_dim >= 2"),
            (self.num_train_timesteps >= 1, f"--policy.num_train_timesteps={self.num_train_timesteps} must be >= 1"),
            (self.num_inference_steps is None or 1 <= self.num_inference_steps <= self.num_train_timesteps, f"--policy.num_inference_steps={self.num_inference_steps} must be in [1, --policy.num_train_timesteps={self.num_train_timesteps}] (or null)"),
            (self.clip_sample_range > 0, f"--policy.clip_sample_range={self.clip_sample_range} must be > 0"),
            (all(mode in NORMALIZATION_MODES for mode in self.normalization_mapping.values()), f"--policy.normalization_mapping={self.normalization_mapping}: each mode must be one of {', '.join(NORMALIZATION_MODES)}"),
            (not self.compile_model, "--policy.compile_model=true: compile with --accelerator.compile=true instead"),
            (self.scheduler_name == "cosine", f"--policy.scheduler_name={self.scheduler_name!r}: only cosine is supported; choose another schedule with --scheduler.type and --use_policy_training_preset=false"),
            (self.optimizer_lr > 0, f"--policy.optimizer_lr must be > 0, got {self.optimizer_lr}"),
            (self.drop_n_last_frames >= 0, f"--policy.drop_n_last_frames={self.drop_n_last_frames} must be >= 0"),
            (self.env_state_dim >= 0 and (not self.obs_dim or self.env_state_dim < self.obs_dim), f"--policy.env_state_dim={self.env_state_dim} must be in [0, obs_dim={self.obs_dim}): the robot state comes first"),
            (not self.env_state_dim or self.vectors[-1:] == [ENV_KEY], f"--policy.env_state_dim={self.env_state_dim} reads the end of {OBS_KEY} as {ENV_KEY}: list it last among the float vectors of --policy.input_features (got {self.vectors})"),
        ])  # fmt: skip

    def policy_class(self) -> type[Policy]:
        return registry.imported("trainer.policies.diffusion.policy", "DiffusionPolicy")

    @classmethod
    def lerobot_adapter(cls) -> LeRobotAdapter[Any]:
        """LeRobot's DiffusionConfig schema and processors (policies/diffusion/lerobot.py)."""
        return registry.imported("trainer.policies.diffusion.lerobot", "DiffusionAdapter")()

    @property
    def vectors(self) -> list[str]:
        """The float vectors the policy reads, in the order they are concatenated into `observation.state`."""
        return [name for name in self.input_features if not is_camera(name)]

    @property
    def cameras(self) -> list[str]:
        """The cameras the policy reads, in config order (the order their features condition in)."""
        return [name for name in self.input_features if is_camera(name) and name != ALL_CAMERAS]

    def features(self) -> DiffusionFeatures:
        """The shapes the model is built for: the state and action widths and each camera's frames."""
        missing = [name for name in self.cameras if len(self.image_shapes.get(name, [])) != 3]
        if missing:
            raise ConfigError(
                f"the Diffusion Policy's config gives no (C, H, W) frame shape for camera {missing[0]} "
                "(--policy.image_shapes): train it on data that has the camera"
            )
        shapes = {name: [int(s) for s in self.image_shapes[name]] for name in self.cameras}
        cameras = {name: (shape[0], shape[1], shape[2]) for name, shape in shapes.items()}
        return DiffusionFeatures(
            state_dim=self.obs_dim - self.env_state_dim,
            action_dim=self.action_dim,
            cameras=cameras,
            env_state_dim=self.env_state_dim,
        )

    @property
    def takes_mixed_members(self) -> bool:
        """Robots that differ in fps and statistics only: each member at its own fps, normalized by its
        own statistics. Their sizes and cameras must agree (`pads_mixed_members` is False): the
        conditioning's width and the U-Net's action channels are the robot's sizes, and every camera has
        its encoder and must be seen, so a robot padded to another's sizes could not be exported for its
        own raw observations."""
        return True

    @property
    def pads_mixed_members(self) -> bool:
        return False

    def with_frame_shapes(self, shapes: dict[str, list[int]]) -> DiffusionConfig:
        """The cameras' frame shapes recorded; a checkpoint's camera at another size than the data's is
        refused (SpatialSoftmax's grid and the conditioning width follow the frame size)."""
        for name, shape in shapes.items():
            saved = self.image_shapes.get(name)
            if saved is not None and list(saved) != list(shape):
                raise ConfigError(
                    f"camera {name!r} gives {tuple(shape)} frames, but the policy was trained on {tuple(saved)}: "
                    "resize the frames, or train a new policy"
                )
        return dataclasses.replace(self, image_shapes={**self.image_shapes, **shapes})

    def _normalize_types(self) -> None:
        """Lists from JSON or flags as the tuples the fields declare."""
        self.down_dims = tuple(int(d) for d in self.down_dims)
        self.optimizer_betas = (float(self.optimizer_betas[0]), float(self.optimizer_betas[1]))
        if self.resize_shape is not None:
            self.resize_shape = tuple(int(s) for s in self.resize_shape)  # type: ignore[assignment]
        if self.crop_shape is not None:
            self.crop_shape = tuple(int(s) for s in self.crop_shape)  # type: ignore[assignment]

    def _derive_crop_shape(self) -> None:
        """With resize_shape, the crop follows crop_ratio (LeRobot's rule). LeRobot silently replaces a
        crop_shape given beside it; here one that disagrees is refused (a saved config agrees)."""
        if self.resize_shape is None:
            return
        derived = (
            (int(self.resize_shape[0] * self.crop_ratio), int(self.resize_shape[1] * self.crop_ratio))
            if self.crop_ratio < 1
            else None
        )
        if self.crop_shape is not None and self.crop_shape != derived:
            raise ConfigError(
                f"--policy.crop_shape={list(self.crop_shape)} beside --policy.resize_shape: the crop is then "
                f"derived from --policy.crop_ratio ({self._shown(derived)}); drop crop_shape and set crop_ratio"
            )
        self.crop_shape = derived

    @staticmethod
    def _shown(shape: tuple[int, ...] | None) -> str:
        return "null" if shape is None else str(list(shape))

    @property
    def observation_delta_indices(self) -> list[int]:
        """The observation steps a sample holds, relative to the current frame (oldest first)."""
        return list(range(1 - self.n_obs_steps, 1))

    @property
    def action_delta_indices(self) -> list[int]:
        """The action steps a sample holds: `horizon` of them from the oldest observation step on."""
        return list(range(1 - self.n_obs_steps, 1 - self.n_obs_steps + self.horizon))

    def backbone_input_shape(self, frame: tuple[int, int]) -> tuple[int, int]:
        """(H, W) of what the trunk sees for a camera's (H, W) frames: resized, then cropped."""
        return self.crop_shape or self.resize_shape or frame

    def check_features(self, features: DiffusionFeatures) -> None:
        """Refuse feature shapes this config cannot be built for (LeRobot's `validate_features`, and a
        crop that would not fit the frames it gets)."""
        if features.state_dim <= 0 or features.action_dim <= 0:
            raise ConfigError(
                f"Diffusion Policy needs {OBS_KEY} and {ACTION_KEY} (got widths {features.state_dim} and "
                f"{features.action_dim}): add the state to --policy.input_features"
            )
        if not features.cameras and not features.env_state_dim:
            raise ConfigError(
                f"Diffusion Policy needs a camera or {ENV_KEY} among its inputs: add one to --policy.input_features"
            )
        shapes = list(features.cameras.items())
        for name, shape in shapes[1:]:
            if shape != shapes[0][1]:
                raise ConfigError(
                    f"camera {name} gives {list(shape)} frames, {shapes[0][0]} {list(shapes[0][1])}: Diffusion "
                    "Policy needs every camera at one shape (resize them in the dataset)"
                )
        if shapes and self.crop_shape is not None:
            seen = self.resize_shape or shapes[0][1][1:]
            if self.crop_shape[0] > seen[0] or self.crop_shape[1] > seen[1]:
                raise ConfigError(
                    f"--policy.crop_shape={list(self.crop_shape)} is larger than the {seen[0]}x{seen[1]} "
                    f"frames it crops ({shapes[0][0]}): crop within them, or resize first with --policy.resize_shape"
                )

    def get_optimizer_preset(self) -> AdamConfig:
        """LeRobot's Diffusion preset (--use_policy_training_preset=true): Adam from the optimizer_* fields
        (gradient clipping at 10, LeRobot's AdamConfig default)."""
        return AdamConfig(
            lr=self.optimizer_lr,
            betas=self.optimizer_betas,
            eps=self.optimizer_eps,
            weight_decay=self.optimizer_weight_decay,
        )

    def get_scheduler_preset(self) -> CosineConfig:
        """LeRobot's diffusers cosine schedule: warmup, then a cosine to 0 at the last step. (diffusers'
        warmup starts at lr 0, step s at s / warmup; ours at (s + 1) / (warmup + 1): the same ramp one
        step shifted.)"""
        return CosineConfig(warmup_steps=self.scheduler_warmup_steps, min_lr_ratio=0.0)

    def normalization_stats(self, stats: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """The dataset's statistics as the mean/std the processors apply, per feature type as
        normalization_mapping says: a MIN_MAX feature's min and max become the centre and half-range that
        map it onto [-1, 1], an IDENTITY one mean 0, std 1. The environment state at the end of
        `observation.state` follows the ENV entry (none in LeRobot's mapping: left as it is)."""
        mapped = {name: self._mapped(name, feature_type(name), value) for name, value in stats.items()}
        if self.env_state_dim and OBS_KEY in stats:
            env = self._mapped(ENV_KEY, "ENV", stats[OBS_KEY])
            state = self.obs_dim - self.env_state_dim
            mapped[OBS_KEY] = {
                stat: torch.cat([mapped[OBS_KEY][stat][:state], env[stat][state:]])
                for stat in ("mean", "std")
            }
        return mapped

    def _mapped(self, name: str, kind: str, stats: dict[str, Any]) -> dict[str, Any]:
        return mapped_stats(name, stats, self.normalization_mapping.get(kind, "IDENTITY"))


def _refuse(checks: list[tuple[bool, str]]) -> None:
    """The first failed check's line, as a ConfigError."""
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
