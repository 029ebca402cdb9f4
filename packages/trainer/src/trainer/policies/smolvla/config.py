"""`--policy.type=smolvla`: LeRobot 0.6.1's SmolVLA configuration, its flag names and defaults.

A LeRobot user's `lerobot-train --policy.type=smolvla ...` flags parse here unchanged. The saved
`config.json` is written in LeRobot's schema (`input_features`/`output_features` as typed feature
dicts, LeRobot's own fields), so LeRobot's `SmolVLAPolicy.from_pretrained` reads a checkpoint of ours;
its adapter (`lerobot.py`) maps that schema back onto this dataclass when a LeRobot (or our) checkpoint is loaded.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from trainer.config import registry
from trainer.config.dataset import Embodiment, FrameResize
from trainer.config.optim import AdamWConfig, CosineDecayWithWarmupConfig
from trainer.config.policy import LEROBOT_RUN_FIELDS, LeRobotAdapter, PolicyConfig
from trainer.data.dataset import ALL_CAMERAS, OBS_KEY, TASK_KEY
from trainer.data.pipeline.normalization import NORMALIZATION_MODES, stats_by_type
from trainer.errors import ConfigError
from trainer.policies.common.vla import features, presets
from trainer.policies.common.vla.images import resize_with_pad

if TYPE_CHECKING:
    from trainer.policies.common.base import Policy

ATTENTION_MODES = ("cross_attn", "self_attn")
PAD_LANGUAGE = ("longest", "max_length")


@PolicyConfig.register_subclass("smolvla")
@dataclass
class SmolVLAConfig(PolicyConfig):
    """LeRobot's SmolVLA: a SmolVLM backbone's first layers and an action expert trained by flow matching."""

    n_obs_steps: int = 1
    """Observation steps per prediction (SmolVLA reads the current one)."""
    chunk_size: int = 50  # a field here, a property on the base
    """Actions predicted per observation."""
    n_action_steps: int = 50
    """Actions of each chunk executed before the model runs again (<= chunk_size)."""
    normalization_mapping: dict[str, str] = field(
        default_factory=lambda: {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"}
    )
    """How each feature type is normalized (LeRobot's; SmolVLA's cameras stay in [0, 1])."""
    max_state_dim: int = 32
    """The state vector is zero-padded to this width before `state_proj`."""
    max_action_dim: int = 32
    """Actions are zero-padded to this width for the flow-matching model."""
    resize_imgs_with_padding: tuple[int, int] | None = (512, 512)
    """(width, height) every camera frame is resized to, aspect kept, zero padding on the left and top."""
    empty_cameras: int = 0
    """Blank camera slots added after the real cameras (LeRobot's aloha-sim setting)."""
    adapt_to_pi_aloha: bool = False
    """LeRobot's pi-aloha joint conversion (not supported here: must stay false)."""
    use_delta_joint_actions_aloha: bool = False
    """Not implemented by LeRobot either: must stay false."""
    tokenizer_max_length: int = 48
    """Language tokens kept per task (a longer task is truncated, as LeRobot's tokenizer step does)."""
    num_steps: int = 10
    """Euler steps of the flow-matching sampler."""
    use_cache: bool = True
    """Compute the prefix's keys and values once per chunk and reuse them in every Euler step (always
    here: false, LeRobot's recomputation at each step, is refused)."""
    freeze_vision_encoder: bool = True
    """Keep the vision tower frozen (and in eval mode)."""
    train_expert_only: bool = True
    """Freeze the whole VLM: only the action expert and the projections train."""
    train_state_proj: bool = True
    """Train the state projection."""
    optimizer_lr: float = 1e-4
    """Learning rate of SmolVLA's training preset (--use_policy_training_preset=true): AdamW and
    LeRobot's cosine decay with warmup."""
    optimizer_betas: tuple[float, float] = (0.9, 0.95)
    """LeRobot's AdamW preset: betas."""
    optimizer_eps: float = 1e-8
    """LeRobot's AdamW preset: eps."""
    optimizer_weight_decay: float = 1e-10
    """LeRobot's AdamW preset: weight decay."""
    optimizer_grad_clip_norm: float = 10
    """LeRobot's preset: gradient clipping norm."""
    scheduler_warmup_steps: int = 1_000
    """LeRobot's cosine-decay-with-warmup preset: warmup steps."""
    scheduler_decay_steps: int = 30_000
    """LeRobot's preset: steps of the cosine decay."""
    scheduler_decay_lr: float = 2.5e-6
    """LeRobot's preset: learning rate at the end of the decay."""
    vlm_model_name: str = "HuggingFaceTB/SmolVLM2-500M-Video-Instruct"
    """The SmolVLM backbone: a local directory (relative to the working directory; recorded absolute) or
    a Hub repo id read through the Hugging Face cache; it gives the VLM's config and the tokenizer."""
    load_vlm_weights: bool = False
    """Start the VLM from the backbone's pretrained weights (else its random init from the config)."""
    add_image_special_tokens: bool = False
    """Put SmolVLM's image start/end tokens around each camera's tokens."""
    attention_mode: str = "cross_attn"
    """cross_attn (the expert cross-attends to the VLM every other layer) or self_attn."""
    prefix_length: int = -1
    """Zero-pad the prefix to this many tokens (-1: no padding)."""
    pad_language_to: str = "longest"
    """Pad the task tokens to the longest in the batch or to tokenizer_max_length (max_length)."""
    num_expert_layers: int = -1
    """Action-expert layers (<= 0: as many as the VLM layers kept; else a divisor of them)."""
    num_vlm_layers: int = 16
    """VLM text layers kept (the first ones)."""
    self_attn_every_n_layers: int = 2
    """In cross_attn mode, layers i % n == 0 are joint self-attention, the others cross-attention."""
    expert_width_multiplier: float = 0.75
    """Action-expert width relative to the VLM's hidden size."""
    min_period: float = 4e-3
    """Shortest period of the flow-matching time's sine-cosine embedding."""
    max_period: float = 4.0
    """Longest period of that embedding."""
    compile_model: bool = False
    """LeRobot's torch.compile switch (use --accelerator.compile here: must stay false)."""
    compile_mode: str = "max-autotune"
    """LeRobot's torch.compile mode (kept for its config.json)."""
    input_features: list[str] = field(default_factory=lambda: [OBS_KEY, ALL_CAMERAS, TASK_KEY])
    """The state vector, the cameras (`observation.images.*`: every camera of the dataset, their
    tokens in this order) and the task text; config.json records the state and cameras with their
    shapes, in LeRobot's schema."""
    image_shapes: dict[str, list[int]] = field(default_factory=dict)
    """Frame shape (C, H, W) of each camera, taken from the dataset."""

    path_fields: ClassVar[tuple[str, ...]] = ("vlm_model_name",)

    def __post_init__(self) -> None:
        super().__post_init__()
        checks = [
            (1 <= self.n_action_steps <= self.chunk_size, f"--policy.n_action_steps={self.n_action_steps} must be in [1, --policy.chunk_size={self.chunk_size}]"),
            (self.n_obs_steps == 1, f"--policy.n_obs_steps={self.n_obs_steps}: SmolVLA reads one observation step"),
            (self.attention_mode in ATTENTION_MODES, f"--policy.attention_mode={self.attention_mode!r}: choose one of {', '.join(ATTENTION_MODES)}"),
            (self.pad_language_to in PAD_LANGUAGE, f"--policy.pad_language_to={self.pad_language_to!r}: choose one of {', '.join(PAD_LANGUAGE)}"),
            (self.num_steps >= 1 and self.tokenizer_max_length >= 1, "--policy.num_steps and --policy.tokenizer_max_length must be >= 1"),
            (min(self.max_state_dim, self.max_action_dim) >= 1, "--policy.max_state_dim and --policy.max_action_dim must be >= 1"),
            (self.expert_width_multiplier > 0, "--policy.expert_width_multiplier must be > 0"),
            (self.optimizer_lr > 0, f"--policy.optimizer_lr must be > 0, got {self.optimizer_lr}"),
            (not self.adapt_to_pi_aloha, "--policy.adapt_to_pi_aloha=true is not supported; convert the dataset's joints instead"),
            (not self.use_delta_joint_actions_aloha, "--policy.use_delta_joint_actions_aloha=true is not implemented (nor is it in LeRobot)"),
            (not self.compile_model, "--policy.compile_model=true: compile with --accelerator.compile=true instead"),
            (self.use_cache, "--policy.use_cache=false is not supported: the sampler always reuses the prefix's keys and values (the same actions as recomputing them)"),
            (set(self.normalization_mapping.values()) <= set(NORMALIZATION_MODES), f"--policy.normalization_mapping={self.normalization_mapping}: each mode must be one of {', '.join(NORMALIZATION_MODES)}"),
            (self.obs_dim <= self.max_state_dim, f"the state has {self.obs_dim} values, more than --policy.max_state_dim={self.max_state_dim}: raise --policy.max_state_dim or drop state features"),
            (self.action_dim <= self.max_action_dim, f"the action has {self.action_dim} values, more than --policy.max_action_dim={self.max_action_dim}: raise --policy.max_action_dim"),
        ]  # fmt: skip
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        if self.resize_imgs_with_padding is not None:
            self.resize_imgs_with_padding = (
                int(self.resize_imgs_with_padding[0]),
                int(self.resize_imgs_with_padding[1]),
            )
        self.optimizer_betas = (float(self.optimizer_betas[0]), float(self.optimizer_betas[1]))

    def get_optimizer_preset(self) -> AdamWConfig:
        """LeRobot's SmolVLA preset (--use_policy_training_preset=true): AdamW from the optimizer_* fields."""
        return presets.adamw(self)

    def get_scheduler_preset(self) -> CosineDecayWithWarmupConfig:
        """LeRobot's SmolVLA schedule: warmup to optimizer_lr, cosine decay to scheduler_decay_lr."""
        return presets.cosine_decay(self)

    def policy_class(self) -> type[Policy]:
        return registry.imported("trainer.policies.smolvla.policy", "SmolVLAPolicy")

    @classmethod
    def lerobot_adapter(cls) -> LeRobotAdapter[Any]:
        """LeRobot's SmolVLA: config.json read back, processors, the backbone flag (policies/smolvla/lerobot.py)."""
        return registry.imported("trainer.policies.smolvla.lerobot", "SmolVLAAdapter")()

    @property
    def takes_mixed_members(self) -> bool:
        """SmolVLA pads state and action to max_state_dim / max_action_dim and masks empty camera slots:
        members of different shapes fit (the loss skips the padded action dims, policy.py)."""
        return True

    def frame_resize(self) -> FrameResize | None:
        """SmolVLA's own resize with left/top padding to `resize_imgs_with_padding` (policy.py), for
        cameras left unnormalized (IDENTITY, LeRobot's default): `PolicyConfig.frame_resize`."""
        if self.resize_imgs_with_padding is None or self.normalization_mapping.get("VISUAL") != "IDENTITY":
            return None
        width, height = self.resize_imgs_with_padding
        return functools.partial(resize_with_pad, height=height, width=width)

    def for_embodiment(self, embodiment: Embodiment) -> SmolVLAConfig:
        """One robot's sizes and features (`PolicyConfig.for_embodiment`), and its cameras' frame shapes
        alone: config.json then lists that robot's cameras (the weights do not depend on any of them)."""
        config = super().for_embodiment(embodiment)
        assert isinstance(config, SmolVLAConfig)
        shapes = {name: shape for name, shape in self.image_shapes.items() if name in config.input_features}
        return dataclasses.replace(config, image_shapes=shapes)

    @property
    def cameras(self) -> list[str]:
        """The cameras the policy reads, in config order (the order of their tokens)."""
        return features.camera_names(self.input_features)

    def with_frame_shapes(self, shapes: dict[str, list[int]]) -> SmolVLAConfig:
        """The cameras' frame shapes recorded (`vla.features.with_frame_shapes`)."""
        return features.with_frame_shapes(self, shapes)

    def normalization_stats(self, stats: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """Each feature normalized as `normalization_mapping` says for its type: cameras under
        VISUAL = IDENTITY (LeRobot's default) keep their [0, 1] values (mean 0, std 1; the preprocessor
        still scales uint8 frames to [0, 1]), a MIN_MAX state or action is mapped onto [-1, 1] from the
        dataset's min and max (as config.json records it)."""
        return stats_by_type(stats, self.normalization_mapping)

    def to_dict(self) -> dict[str, Any]:
        """config.json in LeRobot's SmolVLAConfig schema (LeRobot's `from_pretrained` refuses any field
        it does not know, so ours that have no LeRobot counterpart stay in train_config.json)."""
        typed = features.typed_features(self.obs_dim, self.cameras, self.image_shapes, self.action_dim)
        own = {f.name: getattr(self, f.name) for f in dataclasses.fields(SmolVLAConfig)}
        lerobot = {name: own[name] for name in _lerobot_field_names()}
        return {
            "type": self.type,
            "n_obs_steps": self.n_obs_steps,
            **typed,
            "device": self.device,
            **LEROBOT_RUN_FIELDS,
            **{k: list(v) if isinstance(v, tuple) else v for k, v in lerobot.items()},
            "rtc_config": None,
        }


def _lerobot_field_names() -> list[str]:
    """LeRobot's SmolVLAConfig fields, in its order: ours from chunk_size to compile_mode."""
    names = [f.name for f in dataclasses.fields(SmolVLAConfig)]
    return names[names.index("chunk_size") : names.index("compile_mode") + 1]
