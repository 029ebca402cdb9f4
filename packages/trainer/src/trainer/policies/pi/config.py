"""LeRobot 0.6.1's PI0Config and PI05Config as plain dataclasses, and the model sizes they resolve to.

LeRobot hard-codes the sizes of its two Gemma variants and of PaliGemma's SigLIP; `size_overrides` names a
JSON file that replaces them (the format of LeRobot-side test fixtures: `{"vocab_size": 483,
"gemma_variants": {"gemma_2b": {"width": ...}, ...}, "vision": {"hidden_size": ...}}`), so a tiny model
keeps LeRobot's variant names in its config.json. Every bad value is refused in `__post_init__` with one
line naming the flag.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from trainer.errors import ConfigError

PALIGEMMA_TOKENIZER = "google/paligemma-3b-pt-224"
VOCAB_SIZE = 257_152  # PaliGemma's vocabulary (LeRobot sets it on both Gemmas)
DTYPES = ("bfloat16", "float32")
NORMALIZATION_MODES = ("IDENTITY", "MEAN_STD", "QUANTILES")
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


@dataclass
class PI0Config:
    """LeRobot's PI0Config (fields, names and defaults), plus `tokenizer_name` and `size_overrides`."""

    paligemma_variant: str = "gemma_2b"
    action_expert_variant: str = "gemma_300m"
    dtype: str = "float32"
    n_obs_steps: int = 1
    chunk_size: int = 50
    n_action_steps: int = 50
    max_state_dim: int = 32
    max_action_dim: int = 32
    num_inference_steps: int = 10
    time_sampling_beta_alpha: float = 1.5
    time_sampling_beta_beta: float = 1.0
    time_sampling_scale: float = 0.999
    time_sampling_offset: float = 0.001
    min_period: float = 4e-3
    max_period: float = 4.0
    use_relative_actions: bool = False
    relative_exclude_joints: list[str] = field(default_factory=lambda: ["gripper"])
    action_feature_names: list[str] | None = None
    rtc_config: dict[str, Any] | None = None
    image_resolution: tuple[int, int] = (224, 224)
    empty_cameras: int = 0
    normalization_mapping: dict[str, str] = field(
        default_factory=lambda: {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"}
    )
    gradient_checkpointing: bool = False
    compile_model: bool = False
    compile_mode: str = "max-autotune"
    device: str | None = None
    freeze_vision_encoder: bool = False
    train_expert_only: bool = False
    optimizer_lr: float = 2.5e-5
    optimizer_betas: tuple[float, float] = (0.9, 0.95)
    optimizer_eps: float = 1e-8
    optimizer_weight_decay: float = 0.01
    optimizer_grad_clip_norm: float = 1.0
    scheduler_warmup_steps: int = 1_000
    scheduler_decay_steps: int = 30_000
    scheduler_decay_lr: float = 2.5e-6
    tokenizer_max_length: int = 48
    tokenizer_name: str = PALIGEMMA_TOKENIZER
    """The PaliGemma tokenizer: a local directory (relative to the working directory) or a Hub repo id."""
    size_overrides: str | None = None
    """A JSON file replacing the hard-coded variant and SigLIP sizes (None: LeRobot's sizes)."""

    # pi0.5 differs in the expert (adaRMS on the time, no state token) and in the prompt.
    pi05: ClassVar[bool] = False
    # The sizes, read once here (the overrides file's path may be relative to the working directory).
    _sizes: Sizes | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.image_resolution = (int(self.image_resolution[0]), int(self.image_resolution[1]))
        self.optimizer_betas = (float(self.optimizer_betas[0]), float(self.optimizer_betas[1]))
        variants = ", ".join(GEMMA_VARIANTS)
        modes = set(self.normalization_mapping.values())
        checks = [
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
            (not self.use_relative_actions, "--policy.use_relative_actions=true is not supported yet: train on absolute actions"),
            (self.rtc_config is None, "--policy.rtc_config (real-time chunking) is not supported: leave it unset"),
            (not self.compile_model, "--policy.compile_model=true: compile with --accelerator.compile=true instead"),
        ]  # fmt: skip
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        self._sizes = None
        sizes = self._sizes = self.sizes()
        patch = sizes.vision.patch_size
        if self.image_resolution[0] % patch:
            raise ConfigError(
                f"--policy.image_resolution={list(self.image_resolution)} is not a multiple of SigLIP's patch "
                f"size {patch}: give a multiple of {patch} (LeRobot's default is 224)"
            )
        vlm, expert = sizes.vlm, sizes.expert
        if (vlm.num_heads, vlm.num_kv_heads, vlm.head_dim, vlm.depth) != (
            expert.num_heads, expert.num_kv_heads, expert.head_dim, expert.depth
        ):  # fmt: skip
            raise ConfigError(
                f"--policy.paligemma_variant={self.paligemma_variant} and --policy.action_expert_variant="
                f"{self.action_expert_variant} attend jointly: they need the same depth, heads and head_dim"
            )

    def sizes(self) -> Sizes:
        """The variants' sizes: LeRobot's, or those the `size_overrides` file gives (a variant or a
        SigLIP size it does not name keeps LeRobot's)."""
        if self._sizes is not None:
            return self._sizes
        if self.size_overrides is None:
            variants, vision, vocab = GEMMA_VARIANTS, VisionSize(), VOCAB_SIZE
        else:
            variants, vision, vocab = _read_overrides(self.size_overrides)
        return Sizes(variants[self.paligemma_variant], variants[self.action_expert_variant], vision, vocab)

    @classmethod
    def from_lerobot(cls, saved: dict[str, Any], **ours: Any) -> tuple[PI0Config, Features]:
        """A LeRobot config.json (`type` pi0 or pi05) as this config and the features it names;
        `ours` sets the fields LeRobot has not (tokenizer_name, size_overrides)."""
        kind = saved.get("type")
        config_class = {"pi0": PI0Config, "pi05": PI05Config}.get(str(kind))
        if config_class is None:
            raise ConfigError(f"the config.json has type {kind!r}: a pi0 or pi05 checkpoint is needed")
        names = {f.name for f in dataclasses.fields(config_class) if f.init}
        fields = {k: v for k, v in saved.items() if k in names}
        config = config_class(**{**fields, **ours})
        inputs = saved.get("input_features") or {}
        cameras = tuple(
            name
            for name, feature in inputs.items()
            if feature.get("type") == "VISUAL" and ".empty_camera_" not in name
        )
        state = next((f["shape"][0] for f in inputs.values() if f.get("type") == "STATE"), 0)
        action = (saved.get("output_features") or {}).get("action", {}).get("shape", [0])[0]
        return config, Features(cameras, int(state), int(action))


@dataclass
class PI05Config(PI0Config):
    """LeRobot's PI05Config: PI0Config's fields with pi0.5's defaults (longer prompt, quantiles)."""

    normalization_mapping: dict[str, str] = field(
        default_factory=lambda: {"VISUAL": "IDENTITY", "STATE": "QUANTILES", "ACTION": "QUANTILES"}
    )
    tokenizer_max_length: int = 200
    pi05: ClassVar[bool] = True


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
