"""`--policy.type=pi0` and `--policy.type=pi05`: LeRobot 0.6.1's PI0Config and PI05Config (fields, names,
defaults, training preset), and the model sizes they resolve to.

A LeRobot user's `lerobot-train --policy.type=pi05 ...` flags parse here unchanged. LeRobot hard-codes the
sizes of its two Gemma variants and of PaliGemma's SigLIP; `size_overrides` names a JSON file that
replaces them (the format of LeRobot-side test fixtures: `{"vocab_size": 483, "gemma_variants":
{"gemma_2b": {"width": ...}, ...}, "vision": {"hidden_size": ...}}`), so a tiny model keeps LeRobot's
variant names. `tokenizer_name` names the PaliGemma tokenizer LeRobot hard-codes (its checkpoints record
it in policy_preprocessor.json only). Our config.json keeps both beside LeRobot's fields; `trainer
export` writes LeRobot's schema and reads it back through the adapter (`lerobot.py`). Every bad value is
refused in `__post_init__` with one line naming the flag.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from trainer.config import registry
from trainer.config.dataset import FrameResize
from trainer.config.optim import AdamWConfig, CosineDecayWithWarmupConfig
from trainer.config.policy import LeRobotAdapter, PolicyConfig
from trainer.data.dataset import ALL_CAMERAS, OBS_KEY, TASK_KEY
from trainer.data.pipeline.normalization import stats_by_type
from trainer.errors import ConfigError
from trainer.policies.common.vla import features as vla_features
from trainer.policies.common.vla import presets
from trainer.policies.common.vla.images import resize_with_pad

if TYPE_CHECKING:
    from trainer.policies.common.base import Policy

PALIGEMMA_TOKENIZER = "google/paligemma-3b-pt-224"
VOCAB_SIZE = 257_152  # PaliGemma's vocabulary (LeRobot sets it on both Gemmas)
DTYPES = ("bfloat16", "float32")
NORMALIZATION_MODES = ("IDENTITY", "MEAN_STD", "QUANTILES")  # LeRobot's pi processors know no MIN_MAX
# Keys of a size-overrides file that describe it rather than size anything.
_OVERRIDE_NOTES = ("what", "preset", "tokenizer", "projection_dim")


@dataclass(frozen=True)
class GemmaSize:
    """One Gemma stack (openpi's `gemma.Config`): width, layers, MLP width, heads, KV heads, head width."""

    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class VisionSize:
    """PaliGemma's SigLIP tower (transformers' PaliGemmaConfig defaults, LeRobot's intermediate size)."""

    hidden_size: int = 1152
    intermediate_size: int = 4304
    num_hidden_layers: int = 27
    num_attention_heads: int = 16
    patch_size: int = 14


# LeRobot's get_gemma_config(): the only two variant names its config accepts.
GEMMA_VARIANTS = {
    "gemma_300m": GemmaSize(width=1024, depth=18, mlp_dim=4096, num_heads=8, num_kv_heads=1, head_dim=256),
    "gemma_2b": GemmaSize(width=2048, depth=18, mlp_dim=16_384, num_heads=8, num_kv_heads=1, head_dim=256),
}


@dataclass(frozen=True)
class Sizes:
    """Everything the model's shapes depend on besides the policy fields."""

    vlm: GemmaSize
    expert: GemmaSize
    vision: VisionSize
    vocab_size: int


@dataclass(frozen=True)
class Features:
    """The data the policy reads and writes: cameras in token order, state and action widths."""

    cameras: tuple[str, ...]
    state_dim: int
    action_dim: int


@PolicyConfig.register_subclass("pi0")
@dataclass
class PI0Config(PolicyConfig):
    """LeRobot's pi0: PaliGemma (SigLIP + Gemma 2B) reading the cameras and the task, a Gemma 300M action
    expert attending to it layer by layer, trained by flow matching."""

    dropout: float = 0.0
    """pi0 has no dropout (LeRobot's neither): must stay 0."""
    dtype: str = "float32"
    """float32, or bfloat16 as LeRobot casts it: the Gemma layers and embeddings in bfloat16, the vision
    tower, the projector, every norm and the action projections in float32."""
    paligemma_variant: str = "gemma_2b"
    """PaliGemma's language model: gemma_2b or gemma_300m (sized by --policy.size_overrides)."""
    action_expert_variant: str = "gemma_300m"
    """The action expert: gemma_300m or gemma_2b (the same depth, heads and head_dim as PaliGemma's)."""
    n_obs_steps: int = 1
    """Observation steps per prediction (pi0 reads the current one)."""
    chunk_size: int = 50  # a field here, a property on the base
    """Actions predicted per observation (openpi's action_horizon)."""
    n_action_steps: int = 50
    """Actions of each chunk executed before the model runs again (<= chunk_size)."""
    max_state_dim: int = 32
    """The state vector is zero-padded to this width."""
    max_action_dim: int = 32
    """Actions are zero-padded to this width for the flow-matching model."""
    num_inference_steps: int = 10
    """Euler steps of the flow-matching sampler."""
    time_sampling_beta_alpha: float = 1.5
    """The training time is Beta(alpha, beta) * scale + offset: alpha."""
    time_sampling_beta_beta: float = 1.0
    """The Beta distribution's beta."""
    time_sampling_scale: float = 0.999
    """The scale of the sampled time."""
    time_sampling_offset: float = 0.001
    """The offset of the sampled time."""
    min_period: float = 4e-3
    """Shortest period of the flow-matching time's sine-cosine embedding."""
    max_period: float = 4.0
    """Longest period of that embedding."""
    use_relative_actions: bool = False
    """LeRobot's actions relative to the state (not supported here: must stay false)."""
    relative_exclude_joints: list[str] = field(default_factory=lambda: ["gripper"])
    """Joints kept absolute under use_relative_actions (kept for LeRobot's processor files)."""
    action_feature_names: list[str] | None = None
    """The action's joint names (LeRobot fills them from the dataset; kept for its processor files)."""
    rtc_config: dict[str, Any] | None = None
    """LeRobot's real-time chunking (not supported here: must stay unset)."""
    image_resolution: tuple[int, int] = (224, 224)
    """(height, width) every camera is resized to with centred padding: square, a multiple of SigLIP's patch."""
    empty_cameras: int = 0
    """Blank camera slots added after the real cameras."""
    normalization_mapping: dict[str, str] = field(
        default_factory=lambda: {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"}
    )
    """How each feature type is normalized (IDENTITY, MEAN_STD or QUANTILES; cameras stay on [0, 1])."""
    gradient_checkpointing: bool = False
    """Recompute each SigLIP layer and each joint decoder layer in the backward pass (less activation memory)."""
    compile_model: bool = False
    """LeRobot's torch.compile switch (use --accelerator.compile here: must stay false)."""
    compile_mode: str = "max-autotune"
    """LeRobot's torch.compile mode (kept for its config.json)."""
    freeze_vision_encoder: bool = False
    """Keep the vision tower frozen (and in eval mode)."""
    train_expert_only: bool = False
    """Freeze the whole PaliGemma: only the action expert and the projections train."""
    optimizer_lr: float = 2.5e-5
    """Peak learning rate of pi0's training preset (--use_policy_training_preset=true): AdamW and the
    cosine decay with warmup (openpi's)."""
    optimizer_betas: tuple[float, float] = (0.9, 0.95)
    """The preset's AdamW betas."""
    optimizer_eps: float = 1e-8
    """The preset's AdamW eps."""
    optimizer_weight_decay: float = 0.01
    """The preset's AdamW weight decay."""
    optimizer_grad_clip_norm: float = 1.0
    """The preset's gradient clipping norm."""
    scheduler_warmup_steps: int = 1_000
    """The preset's warmup steps (scaled down with the decay when --steps is shorter than the decay)."""
    scheduler_decay_steps: int = 30_000
    """The preset's cosine decay steps."""
    scheduler_decay_lr: float = 2.5e-6
    """The preset's learning rate at the end of the decay."""
    tokenizer_max_length: int = 48
    """Prompt tokens (right-padded to this length, a longer prompt truncated)."""
    tokenizer_name: str = PALIGEMMA_TOKENIZER
    """The PaliGemma tokenizer: a local directory (relative to the working directory; recorded absolute)
    or a Hub repo id read through the Hugging Face cache (a LeRobot checkpoint's policy_preprocessor.json
    names its own)."""
    size_overrides: str | None = None
    """A JSON file replacing LeRobot's hard-coded variant and SigLIP sizes (docs/pi.md; None: LeRobot's);
    recorded absolute."""
    input_features: list[str] = field(default_factory=lambda: [OBS_KEY, ALL_CAMERAS, TASK_KEY])
    """The state vector, the cameras (`observation.images.*`: every camera of the dataset, their tokens
    in this order) and the task text."""
    image_shapes: dict[str, list[int]] = field(default_factory=dict)
    """Frame shape (C, H, W) of each camera, taken from the dataset (LeRobot's config.json records it)."""

    path_fields: ClassVar[tuple[str, ...]] = ("size_overrides", "tokenizer_name")
    # pi0.5 differs in the expert (adaRMS on the time, no state token) and in the prompt.
    pi05: ClassVar[bool] = False

    def __post_init__(self) -> None:
        super().__post_init__()
        self.image_resolution = (int(self.image_resolution[0]), int(self.image_resolution[1]))
        self.optimizer_betas = (float(self.optimizer_betas[0]), float(self.optimizer_betas[1]))
        variants = ", ".join(GEMMA_VARIANTS)
        modes = set(self.normalization_mapping.values())
        checks = [
            (self.dropout == 0.0, f"--policy.dropout={self.dropout}: pi0 has no dropout; leave it at 0"),
            (self.paligemma_variant in GEMMA_VARIANTS, f"--policy.paligemma_variant={self.paligemma_variant!r} is not a LeRobot variant: choose one of {variants}"),
            (self.action_expert_variant in GEMMA_VARIANTS, f"--policy.action_expert_variant={self.action_expert_variant!r} is not a LeRobot variant: choose one of {variants}"),
            (self.dtype in DTYPES, f"--policy.dtype={self.dtype!r}: choose one of {', '.join(DTYPES)}"),
            (1 <= self.n_action_steps <= self.chunk_size, f"--policy.n_action_steps={self.n_action_steps} must be in [1, --policy.chunk_size={self.chunk_size}]"),
            (self.n_obs_steps == 1, f"--policy.n_obs_steps={self.n_obs_steps}: pi0 reads one observation step"),
            (self.num_inference_steps >= 1, f"--policy.num_inference_steps={self.num_inference_steps} must be >= 1"),
            (self.tokenizer_max_length >= 1, f"--policy.tokenizer_max_length={self.tokenizer_max_length} must be >= 1"),
            (min(self.max_state_dim, self.max_action_dim) >= 1, "--policy.max_state_dim and --policy.max_action_dim must be >= 1"),
            (self.empty_cameras >= 0, f"--policy.empty_cameras={self.empty_cameras} must be >= 0"),
            (self.image_resolution[0] == self.image_resolution[1], f"--policy.image_resolution={list(self.image_resolution)}: PaliGemma takes square images (give [N, N])"),
            (modes <= set(NORMALIZATION_MODES), f"--policy.normalization_mapping={self.normalization_mapping}: each mode must be one of {', '.join(NORMALIZATION_MODES)}"),
            (self.optimizer_lr > 0, f"--policy.optimizer_lr must be > 0, got {self.optimizer_lr}"),
            (not self.use_relative_actions, "--policy.use_relative_actions=true is not supported yet: train on absolute actions"),
            (self.rtc_config is None, "--policy.rtc_config (real-time chunking) is not supported: leave it unset"),
            (not self.compile_model, "--policy.compile_model=true: compile with --accelerator.compile=true instead"),
            (self.obs_dim <= self.max_state_dim, f"the state has {self.obs_dim} values, more than --policy.max_state_dim={self.max_state_dim}: raise --policy.max_state_dim or drop state features"),
            (self.action_dim <= self.max_action_dim, f"the action has {self.action_dim} values, more than --policy.max_action_dim={self.max_action_dim}: raise --policy.max_action_dim"),
        ]  # fmt: skip
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        self._sizes = _read_sizes(self)

    def sizes(self) -> Sizes:
        """The variants' sizes: LeRobot's, or those the `size_overrides` file gives (a variant or a
        SigLIP size it does not name keeps LeRobot's), read when the config was made."""
        return self._sizes

    @property
    def cast_dtype(self) -> None:
        """None: the policy places LeRobot's dtypes itself (bfloat16 keeps its float32 parts)."""
        return None

    def frame_resize(self) -> FrameResize | None:
        """openpi's resize with centred padding to `image_resolution` (policy.py), for cameras left
        unnormalized (IDENTITY, LeRobot's default): `PolicyConfig.frame_resize`."""
        if self.normalization_mapping.get("VISUAL") != "IDENTITY":
            return None
        height, width = self.image_resolution
        return functools.partial(resize_with_pad, height=height, width=width, centred=True)

    def policy_class(self) -> type[Policy]:
        return registry.imported("trainer.policies.pi.policy", "PI0Policy")

    @classmethod
    def lerobot_adapter(cls) -> LeRobotAdapter[Any]:
        """LeRobot's PI0Config / PI05Config schema, tensor names and processors (policies/pi/lerobot.py)."""
        adapter: LeRobotAdapter[Any] = registry.imported("trainer.policies.pi.lerobot", "PiAdapter")(cls.pi05)
        return adapter

    @property
    def cameras(self) -> list[str]:
        """The cameras the policy reads, in config order (the order of their tokens)."""
        return vla_features.camera_names(self.input_features)

    def features(self) -> Features:
        """The data the model is built for: its cameras, state and action widths."""
        return Features(tuple(self.cameras), self.obs_dim, self.action_dim)

    def with_frame_shapes(self, shapes: dict[str, list[int]]) -> PI0Config:
        """The cameras' frame shapes recorded (`vla.features.with_frame_shapes`)."""
        return vla_features.with_frame_shapes(self, shapes)

    def get_optimizer_preset(self) -> AdamWConfig:
        """LeRobot's pi0 preset (--use_policy_training_preset=true): AdamW from the optimizer_* fields."""
        return presets.adamw(self)

    def get_scheduler_preset(self) -> CosineDecayWithWarmupConfig:
        """LeRobot's pi0 schedule: warmup to optimizer_lr, cosine decay to scheduler_decay_lr."""
        return presets.cosine_decay(self)

    def normalization_stats(self, stats: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """Each feature normalized as `normalization_mapping` says for its type: cameras (IDENTITY) on
        [0, 1], pi0's state and action by MEAN_STD, pi0.5's by QUANTILES (the dataset's q01 and q99
        mapped onto [-1, 1], unclipped, as LeRobot's normalizer does)."""
        return stats_by_type(stats, self.normalization_mapping)


@PolicyConfig.register_subclass("pi05")
@dataclass
class PI05Config(PI0Config):
    """LeRobot's pi0.5: pi0 with the state discretized into the prompt, the time conditioning the
    expert's norms (adaRMS), QUANTILES normalization and a longer prompt."""

    normalization_mapping: dict[str, str] = field(
        default_factory=lambda: {"VISUAL": "IDENTITY", "STATE": "QUANTILES", "ACTION": "QUANTILES"}
    )
    """How each feature type is normalized (pi0.5: the state and action by QUANTILES, onto [-1, 1])."""
    tokenizer_max_length: int = 200
    """Prompt tokens (the task and the 256-bin state, right-padded to this length)."""
    pi05: ClassVar[bool] = True

    def policy_class(self) -> type[Policy]:
        return registry.imported("trainer.policies.pi.policy", "PI05Policy")


def _read_sizes(config: PI0Config) -> Sizes:
    """The sizes `config` resolves to (`PI0Config.sizes`), checked: an image size SigLIP's patches do
    not tile and two variants that cannot attend jointly are one line each."""
    if config.size_overrides is None:
        variants, vision, vocab = GEMMA_VARIANTS, VisionSize(), VOCAB_SIZE
    else:
        variants, vision, vocab = _read_overrides(config.size_overrides)
    sizes = Sizes(variants[config.paligemma_variant], variants[config.action_expert_variant], vision, vocab)
    patch = sizes.vision.patch_size
    if config.image_resolution[0] % patch:
        raise ConfigError(
            f"--policy.image_resolution={list(config.image_resolution)} is not a multiple of SigLIP's patch "
            f"size {patch}: give a multiple of {patch} (LeRobot's default is 224)"
        )
    vlm, expert = sizes.vlm, sizes.expert
    if (vlm.num_heads, vlm.num_kv_heads, vlm.head_dim, vlm.depth) != (
        expert.num_heads, expert.num_kv_heads, expert.head_dim, expert.depth
    ):  # fmt: skip
        raise ConfigError(
            f"--policy.paligemma_variant={config.paligemma_variant} and --policy.action_expert_variant="
            f"{config.action_expert_variant} attend jointly: they need the same depth, heads and head_dim"
        )
    return sizes


def _read_overrides(path: str) -> tuple[dict[str, GemmaSize], VisionSize, int]:
    """The sizes a size-overrides file gives; one line for a missing, malformed or incomplete file."""
    flag = f"--policy.size_overrides={path}"
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"{flag}: cannot read it ({exc.strerror}); give the JSON file of sizes") from None
    except ValueError as exc:
        raise ConfigError(f"{flag}: not JSON ({exc}); give the JSON file of sizes") from None
    known = {"vocab_size", "gemma_variants", "vision", *_OVERRIDE_NOTES}
    unknown = sorted(set(data) - known) if isinstance(data, dict) else ["(not an object)"]
    if unknown:
        raise ConfigError(f"{flag}: unexpected {unknown[0]!r}; it may set vocab_size, gemma_variants, vision")
    try:
        variants = {name: GemmaSize(**size) for name, size in data.get("gemma_variants", {}).items()}
        vision = VisionSize(**data.get("vision", {}))
        vocab = int(data.get("vocab_size", VOCAB_SIZE))
    except (TypeError, AttributeError, ValueError) as exc:
        raise ConfigError(f"{flag}: malformed sizes ({exc}); see docs/pi.md for the format") from None
    return {**GEMMA_VARIANTS, **variants}, vision, vocab
