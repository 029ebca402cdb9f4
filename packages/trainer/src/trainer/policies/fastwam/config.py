"""`--policy.type=fastwam`: LeRobot 0.6.1's FastWAMConfig (fields, names, defaults, training preset) and
the two experts' sizes its `video_dit_config` / `action_dit_config` dicts resolve to.

A LeRobot user's `lerobot-train --policy.type=fastwam ...` flags parse here unchanged. Ours differ in
three places, each checked in `__post_init__`: `action_dim` and `proprio_dim` default to the dataset's
widths (0; `proprio_dim=null` drops the proprio token as in LeRobot), the dtype is LeRobot's
`torch_dtype` (our `--policy.dtype` stays unset), and the settings LeRobot's action inference never
reads (`text_cfg_scale`, `negative_prompt`) or cannot run (`tiled`) must keep their defaults.
LeRobot's config.json both ways and its processors live in lerobot.py (`FastWAMAdapter`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trainer.config import registry
from trainer.config.optim import AdamWConfig, ConstantConfig
from trainer.config.policy import LeRobotAdapter, PolicyConfig
from trainer.data.dataset import ALL_CAMERAS, OBS_KEY, TASK_KEY
from trainer.data.pipeline.normalization import NORMALIZATION_MODES, stats_by_type
from trainer.errors import ConfigError
from trainer.policies.common.vla import features as vla_features

if TYPE_CHECKING:
    from trainer.policies.common.base import Policy

WAN22_MODEL_ID = "Wan-AI/Wan2.2-TI2V-5B"
WAN22_DIFFUSERS_MODEL_ID = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
FASTWAM_BASE_MODEL_ID = "lerobot/fastwam_base"
UMT5_TOKENIZER_ID = "google/umt5-xxl"
DTYPES = ("bfloat16", "float32")


@dataclass(frozen=True)
class VideoSize:
    """The video expert (LeRobot's `video_dit_config`, Wan2.2-TI2V-5B's DiT at its default)."""

    patch_size: tuple[int, int, int] = (1, 2, 2)
    in_dim: int = 48
    hidden_dim: int = 3072
    ffn_dim: int = 14336
    freq_dim: int = 256
    text_dim: int = 4096
    out_dim: int = 48
    num_heads: int = 24
    attn_head_dim: int = 128
    num_layers: int = 30
    eps: float = 1e-6
    seperated_timestep: bool = True
    use_gradient_checkpointing: bool = False
    video_attention_mask_mode: str = "first_frame_causal"
    action_conditioned: bool = False
    action_dim: int = 7
    action_group_causal_mask_mode: str = "group_diagonal"
    fp32_attention: bool = True


@dataclass(frozen=True)
class ActionSize:
    """The action expert (LeRobot's `action_dit_config`)."""

    action_dim: int = 7
    hidden_dim: int = 1024
    ffn_dim: int = 4096
    num_heads: int = 24
    attn_head_dim: int = 128
    num_layers: int = 30
    text_dim: int = 4096
    freq_dim: int = 256
    eps: float = 1e-6
    use_gradient_checkpointing: bool = False
    fp32_attention: bool = True


def _size_dict(size: VideoSize | ActionSize) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(size).items()}


@PolicyConfig.register_subclass("fastwam")
@dataclass
class FastWAMConfig(PolicyConfig):
    """LeRobot's FastWAM: a Wan2.2 video DiT and an action DiT sharing joint attention in every layer
    (a Mixture-of-Transformers), trained by flow matching on future video latents and action chunks,
    conditioned on a frozen UMT5 text encoder's prompt, the state as one more context token, and the
    first frame through a frozen Wan2.2 VAE."""

    dropout: float = 0.0
    """FastWAM has no dropout: must stay 0."""
    n_obs_steps: int = 1
    """LeRobot's field (the video window is `num_video_frames`): must stay 1."""
    proprio_dim: int | None = 0
    """State width of the proprio context token: 0 takes the dataset's, null uses no state."""
    action_horizon: int = 32
    """Actions predicted per observation."""
    n_action_steps: int = 32
    """Actions of each chunk executed before the model runs again (<= action_horizon)."""
    num_video_frames: int = 33
    """Raw frames of the video window (frame 0 is the current one), subsampled by action_video_freq_ratio."""
    action_video_freq_ratio: int = 4
    """Actions per video frame: the window's frames are read every this many frames."""
    image_size: tuple[int, int] = (224, 448)
    """(height, width) of the cameras concatenated side by side (each camera width / cameras wide)."""
    context_len: int = 128
    """LeRobot's field, which its FastWAM never reads either (the prompt length is tokenizer_max_len);
    kept for its config.json."""
    model_id: str = WAN22_MODEL_ID
    """LeRobot's Wan2.2 DiT repo, which its policy never reads either (only its offline base builder);
    kept for its config.json."""
    tokenizer_model_id: str = UMT5_TOKENIZER_ID
    """The UMT5 tokenizer: a directory (relative to the working directory) or a Hub repo id."""
    text_encoder_model_id: str = WAN22_DIFFUSERS_MODEL_ID
    """The diffusers Wan2.2 repo or directory holding the frozen `text_encoder/` (UMT5) and `vae/`."""
    base_model_id: str | None = FASTWAM_BASE_MODEL_ID
    """LeRobot loads these weights into a default-sized fresh policy: give them as --policy.path here."""
    tokenizer_max_len: int = 128
    """Prompt tokens (right-padded with <pad>, truncated keeping </s>)."""
    load_text_encoder: bool = True
    """The prompt is encoded by the frozen UMT5 encoder (must stay true)."""
    mot_checkpoint_mixed_attn: bool = False
    """Recompute each layer's joint attention in the backward pass."""
    torch_dtype: str = "bfloat16"
    """The dtype of every weight, frozen parts included (bfloat16 or float32)."""
    prompt_template: str = (
        "A video recorded from a robot's point of view executing the following instruction: {task}"
    )
    """The prompt around the task text."""
    num_inference_steps: int = 10
    """Euler steps of the action sampler."""
    inference_seed: int | None = 42
    """Seed of the initial action noise (the same for every sample); null draws from the global RNG."""
    rand_device: str = "cpu"
    """Device of that generator."""
    text_cfg_scale: float = 1.0
    """LeRobot's field, unused by its action inference: must stay 1."""
    negative_prompt: str = ""
    """LeRobot's field, unused by its action inference: must stay empty."""
    sigma_shift: float | None = None
    """The sampler's shift (None: action_scheduler's infer_shift)."""
    tiled: bool = False
    """LeRobot's tiled VAE encoding (not implemented there either): must stay false."""
    fp32_attention: bool = True
    """Attention in float32 (copied into both experts' configs, as LeRobot does)."""
    use_gradient_checkpointing: bool = False
    """Recompute each MoT layer in the backward pass (copied into both experts' configs)."""
    freeze_video_expert: bool = False
    """Train the action expert and the proprio encoder only (then set loss.lambda_video=0)."""
    toggle_action_dimensions: list[int] = field(default_factory=list)
    """Action dimensions (negative from the end) whose acted value v becomes sign(1 - 2v) after the
    unnormalizer: LeRobot's LIBERO gripper toggle (its postprocessor's `fastwam_action_toggle_processor`).
    Training never reads it."""
    video_scheduler: dict[str, float] = field(
        default_factory=lambda: {"train_shift": 5.0, "infer_shift": 5.0, "num_train_timesteps": 1000}
    )
    """The video flow-matching schedule: training and inference shifts, timestep scale."""
    action_scheduler: dict[str, float] = field(
        default_factory=lambda: {"train_shift": 5.0, "infer_shift": 5.0, "num_train_timesteps": 1000}
    )
    """The action flow-matching schedule."""
    loss: dict[str, float] = field(default_factory=lambda: {"lambda_video": 1.0, "lambda_action": 1.0})
    """Weights of the video and the action loss."""
    video_dit_config: dict[str, Any] | None = None
    """The video expert's sizes (None: Wan2.2-TI2V-5B's)."""
    action_dit_config: dict[str, Any] | None = None
    """The action expert's sizes (None: LeRobot's 1.02 B expert)."""
    normalization_mapping: dict[str, str] = field(
        default_factory=lambda: {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"}
    )
    """How each feature type is normalized (cameras stay on [0, 1])."""
    optimizer_lr: float = 1e-4
    """Learning rate of FastWAM's preset (--use_policy_training_preset=true): AdamW, no schedule."""
    optimizer_weight_decay: float = 1e-2
    """The preset's weight decay."""
    input_features: list[str] = field(default_factory=lambda: [OBS_KEY, ALL_CAMERAS, TASK_KEY])
    """The state, the cameras (concatenated in sorted order) and the task text."""
    image_shapes: dict[str, list[int]] = field(default_factory=dict)
    """Frame shape (C, H, W) of each camera, taken from the dataset (LeRobot's config.json records it)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.image_size = (int(self.image_size[0]), int(self.image_size[1]))
        self.video_dit_config = self._expert_dict(
            self.video_dit_config, VideoSize(action_dim=self.action_dim or 7)
        )
        self.action_dit_config = self._expert_dict(
            self.action_dit_config, ActionSize(action_dim=self.action_dim or 7)
        )
        transitions, rest = divmod(self.num_video_frames - 1, self.action_video_freq_ratio or 1)
        modes = set(self.normalization_mapping.values())
        checks = [
            (self.dropout == 0.0, f"--policy.dropout={self.dropout}: FastWAM has no dropout; leave it at 0"),
            (self.dtype is None, f"--policy.dtype={self.dtype}: FastWAM's dtype is --policy.torch_dtype (bfloat16 or float32)"),
            (self.torch_dtype in DTYPES, f"--policy.torch_dtype={self.torch_dtype!r}: choose one of {', '.join(DTYPES)}"),
            (self.n_obs_steps == 1, f"--policy.n_obs_steps={self.n_obs_steps}: FastWAM's window is --policy.num_video_frames; leave it at 1"),
            (1 <= self.n_action_steps <= self.action_horizon, f"--policy.n_action_steps={self.n_action_steps} must be in [1, --policy.action_horizon={self.action_horizon}]"),
            (self.action_video_freq_ratio >= 1, f"--policy.action_video_freq_ratio={self.action_video_freq_ratio} must be >= 1"),
            (rest == 0 and transitions >= 1, f"--policy.num_video_frames={self.num_video_frames}: num_video_frames - 1 must be a positive multiple of --policy.action_video_freq_ratio={self.action_video_freq_ratio}"),
            (transitions % 4 == 0, f"--policy.num_video_frames={self.num_video_frames} gives {transitions + 1} model frames: the Wan VAE needs 4k + 1 (e.g. 33 with ratio 4, 9 with ratio 2)"),
            (transitions == 0 or self.action_horizon % transitions == 0, f"--policy.action_horizon={self.action_horizon} must be a multiple of the window's {transitions} video transitions"),
            (self.num_inference_steps >= 1, f"--policy.num_inference_steps={self.num_inference_steps} must be >= 1"),
            (self.tokenizer_max_len >= 1, f"--policy.tokenizer_max_len={self.tokenizer_max_len} must be >= 1"),
            (self.load_text_encoder, "--policy.load_text_encoder=false: FastWAM here encodes every prompt with the frozen UMT5; leave it true"),
            (self.text_cfg_scale == 1.0 and self.negative_prompt == "", "--policy.text_cfg_scale / --policy.negative_prompt: LeRobot's action inference never reads them; leave 1.0 and \"\""),
            (not self.tiled, "--policy.tiled=true: tiled VAE encoding is not implemented (LeRobot's neither); leave it false"),
            (modes <= set(NORMALIZATION_MODES), f"--policy.normalization_mapping={self.normalization_mapping}: each mode must be one of {', '.join(NORMALIZATION_MODES)}"),
            (self.optimizer_lr > 0, f"--policy.optimizer_lr must be > 0, got {self.optimizer_lr}"),
            (self.proprio_dim is None or self.proprio_dim >= 0, f"--policy.proprio_dim={self.proprio_dim} must be >= 0 (0: the dataset's) or null"),
        ]  # fmt: skip
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        for name, keys in (("video_scheduler", ("train_shift", "infer_shift", "num_train_timesteps")), ("action_scheduler", ("train_shift", "infer_shift", "num_train_timesteps")), ("loss", ("lambda_video", "lambda_action"))):  # fmt: skip
            given = getattr(self, name)
            if set(given) != set(keys) or any(float(given[k]) < 0 for k in keys):
                raise ConfigError(f"--policy.{name}={given}: give exactly {', '.join(keys)}, each >= 0")
        self._check_experts()
        if self.base_model_id and self.path is None and self._base_sized():
            raise ConfigError(
                f"--policy.base_model_id={self.base_model_id}: LeRobot starts a default-sized FastWAM from "
                "these weights; here give them as --policy.path (a LeRobot checkpoint), or set "
                "--policy.base_model_id=null to train from scratch"
            )

    def _expert_dict(self, given: dict[str, Any] | None, default: VideoSize | ActionSize) -> dict[str, Any]:
        """The expert's size dict, LeRobot's defaults for keys it omits, with the top-level attention and
        checkpointing switches and the action width copied in (as LeRobot's `__post_init__` and its default
        dicts do)."""
        known = {f.name for f in dataclasses.fields(default)}
        unknown = sorted(set(given or {}) - known)
        if unknown:
            raise ConfigError(
                f"--policy.{'video' if isinstance(default, VideoSize) else 'action'}_dit_config: unknown key "
                f"{unknown[0]!r}; its keys are {', '.join(sorted(known))}"
            )
        merged = {**_size_dict(default), **(given or {})}
        if self.action_dim:
            merged["action_dim"] = self.action_dim
        merged["fp32_attention"] = bool(self.fp32_attention)
        merged["use_gradient_checkpointing"] = bool(self.use_gradient_checkpointing)
        return merged

    def video_size(self) -> VideoSize:
        """The video expert's sizes (`video_dit_config`)."""
        size = dict(self.video_dit_config or {})
        size["patch_size"] = tuple(int(p) for p in size["patch_size"])
        return VideoSize(**size)

    def action_size(self) -> ActionSize:
        """The action expert's sizes (`action_dit_config`)."""
        return ActionSize(**(self.action_dit_config or {}))

    def _check_experts(self) -> None:
        video, action = self.video_size(), self.action_size()
        flag = "--policy.video_dit_config"
        checks = [
            (video.attn_head_dim * video.num_heads == video.hidden_dim, f"{flag}: attn_head_dim x num_heads must equal hidden_dim (Wan's head width)"),
            (video.attn_head_dim % 2 == 0 and video.freq_dim % 2 == 0 and action.freq_dim % 2 == 0, "--policy.*_dit_config: attn_head_dim and freq_dim must be even"),
            (video.video_attention_mask_mode == "first_frame_causal", f"{flag}: video_attention_mask_mode must be first_frame_causal (the only mode FastWAM's action inference runs)"),
            (not video.action_conditioned and video.seperated_timestep, f"{flag}: FastWAM needs action_conditioned=false and seperated_timestep=true"),
            ((video.num_heads, video.attn_head_dim, video.num_layers) == (action.num_heads, action.attn_head_dim, action.num_layers), "--policy.video_dit_config and --policy.action_dit_config attend jointly: they need the same num_heads, attn_head_dim and num_layers"),
            (video.text_dim == action.text_dim, "--policy.video_dit_config and --policy.action_dit_config read the same prompt: give them the same text_dim"),
        ]  # fmt: skip
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)

    def _base_sized(self) -> bool:
        """Whether LeRobot would load `base_model_id` into this config (its experts at the default sizes)."""
        video_keys = ("patch_size", "in_dim", "hidden_dim", "ffn_dim", "freq_dim", "text_dim", "out_dim", "num_heads", "attn_head_dim", "num_layers")  # fmt: skip
        action_keys = (
            "hidden_dim",
            "ffn_dim",
            "num_heads",
            "attn_head_dim",
            "num_layers",
            "text_dim",
            "freq_dim",
        )
        video, action = _size_dict(VideoSize()), _size_dict(ActionSize())
        return all((self.video_dit_config or {})[k] == video[k] for k in video_keys) and all(
            (self.action_dit_config or {})[k] == action[k] for k in action_keys
        )

    def policy_class(self) -> type[Policy]:
        return registry.imported("trainer.policies.fastwam.policy", "FastWAMPolicy")

    @classmethod
    def lerobot_adapter(cls) -> LeRobotAdapter[Any]:
        """LeRobot's FastWAMConfig schema and processors (policies/fastwam/lerobot.py)."""
        return registry.imported("trainer.policies.fastwam.lerobot", "FastWAMAdapter")()

    @property
    def chunk_size(self) -> int:
        return self.action_horizon

    @property
    def model_video_frames(self) -> int:
        """The frames the model sees: the window subsampled (33 raw frames, ratio 4: 9)."""
        return (self.num_video_frames - 1) // self.action_video_freq_ratio + 1

    @property
    def observation_delta_indices(self) -> list[int]:
        """LeRobot's: the window's frames every `action_video_freq_ratio` (0, 4, ..., 32), the state too."""
        return list(range(0, self.num_video_frames, self.action_video_freq_ratio))

    @property
    def action_delta_indices(self) -> list[int]:
        return list(range(self.action_horizon))

    @property
    def cast_dtype(self) -> str:
        return self.torch_dtype

    @property
    def cameras(self) -> list[str]:
        """The cameras, in LeRobot's concatenation order (sorted by name)."""
        return sorted(vla_features.camera_names(self.input_features))

    @property
    def state_dim(self) -> int | None:
        """The proprio token's width (None: no token)."""
        return None if self.proprio_dim is None else (self.proprio_dim or self.obs_dim)

    def with_frame_shapes(self, shapes: dict[str, list[int]]) -> FastWAMConfig:
        """The cameras' frame shapes recorded (`vla.features.with_frame_shapes`)."""
        return vla_features.with_frame_shapes(self, shapes)

    def get_optimizer_preset(self) -> AdamWConfig:
        """LeRobot's FastWAM preset: AdamW (betas 0.9/0.999, eps 1e-8, clip 10) at optimizer_lr."""
        return AdamWConfig(
            lr=self.optimizer_lr, weight_decay=self.optimizer_weight_decay, grad_clip_norm=10.0
        )

    def get_scheduler_preset(self) -> ConstantConfig:
        """LeRobot's FastWAM has no scheduler: the constant rate."""
        return ConstantConfig(warmup_steps=0)

    def normalization_stats(self, stats: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """Each feature normalized as `normalization_mapping` says for its type (cameras IDENTITY)."""
        return stats_by_type(stats, self.normalization_mapping)
