"""ACT's config: LeRobot's flag names and defaults, its training preset and its normalization; the
policy it builds is `policy.ACTPolicy`, imported when one is built."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from trainer.config import registry
from trainer.config.optim import AdamWConfig, ConstantConfig
from trainer.config.policy import LeRobotAdapter, PolicyConfig
from trainer.data.dataset import ALL_CAMERAS, ENV_KEY, OBS_KEY
from trainer.errors import ConfigError
from trainer.policies.common import resnet

if TYPE_CHECKING:
    from trainer.policies.common.base import Policy

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"relu": F.relu, "gelu": F.gelu}


@PolicyConfig.register_subclass("act")
@dataclass
class ACTConfig(PolicyConfig):
    """LeRobot's ACT: cameras through a ResNet trunk, a transformer encoder-decoder, a CVAE in training."""

    n_obs_steps: int = 1
    """Observation steps per prediction (ACT reads the current one only)."""
    chunk_size: int = 100  # a field here, a property on the base
    """Actions predicted per observation."""
    n_action_steps: int = 100
    """Actions of each chunk executed before the model runs again (<= chunk_size)."""
    vision_backbone: str = "resnet18"
    """Camera trunk: resnet18 or resnet34 (torchvision's architecture and weight names)."""
    pretrained_backbone_weights: str | None = "ResNet18_Weights.IMAGENET1K_V1"
    """Trunk weights at the start of training: a local safetensors file (torchvision or timm names), a
    Hub repo id, or torchvision's enum name (read as timm's copy through the HF cache); null trains the
    trunk from scratch. Unused without cameras."""
    replace_final_stride_with_dilation: bool = False
    """Dilate layer4 instead of striding it (a twice-as-large feature map per side)."""
    pre_norm: bool = False
    """Layer norm before attention and feed-forward instead of after."""
    dim_model: int = 512
    """Transformer width."""
    n_heads: int = 8
    """Attention heads."""
    dim_feedforward: int = 3200
    """Feed-forward hidden width."""
    feedforward_activation: str = "relu"
    """Feed-forward activation: relu or gelu."""
    n_encoder_layers: int = 4
    """Transformer encoder depth."""
    n_decoder_layers: int = 1
    """Transformer decoder depth."""
    use_vae: bool = True
    """Train with the CVAE encoder over the action chunk (its latent is zero at run time)."""
    latent_dim: int = 32
    """Size of the CVAE latent."""
    n_vae_encoder_layers: int = 4
    """CVAE encoder depth."""
    temporal_ensemble_coeff: float | None = None
    """Temporal ensembling weight exp(-coeff * i) over overlapping chunks (needs n_action_steps=1);
    null executes the action queue."""
    kl_weight: float = 10.0
    """Weight of the KL term in the loss."""
    optimizer_lr: float = 1e-5
    """Learning rate of ACT's training preset (--use_policy_training_preset=true): AdamW, no schedule."""
    optimizer_weight_decay: float = 1e-4
    """Weight decay of ACT's training preset."""
    optimizer_lr_backbone: float = 1e-5
    """Learning rate of the camera trunk (its own optimizer parameter group; the rest uses the optimizer's lr)."""
    input_features: list[str] = field(default_factory=lambda: [ALL_CAMERAS])
    """Observation features the policy reads: float vectors, concatenated in this order into
    `observation.state`, and cameras; `observation.images.*` stands for every camera of the dataset,
    beside every float vector when none is named (config.json records the resolved list)."""
    image_shapes: dict[str, list[int]] = field(default_factory=dict)
    """Frame shape (C, H, W) of each camera, taken from the dataset (config.json records it; frames of
    another shape are refused)."""
    env_state_dim: int = 0
    """Width of LeRobot's `observation.environment_state` at the end of `observation.state` (the last
    of the input features): read as a token of its own and left unnormalized, as LeRobot's ACT does;
    0 reads the whole state as one token. Taken from the data when the environment state is among the
    input features (from a LeRobot checkpoint's config.json when fine-tuning one)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        checks = [
            (self.dim_model % self.n_heads == 0, f"--policy.dim_model={self.dim_model} must be divisible by --policy.n_heads={self.n_heads}"),
            (self.n_obs_steps == 1, f"--policy.n_obs_steps={self.n_obs_steps}: ACT reads one observation step"),
            (1 <= self.n_action_steps <= self.chunk_size, f"--policy.n_action_steps={self.n_action_steps} must be in [1, --policy.chunk_size={self.chunk_size}]"),
            (min(self.n_encoder_layers, self.n_decoder_layers, self.n_vae_encoder_layers, self.latent_dim) >= 1, "--policy.n_encoder_layers, n_decoder_layers, n_vae_encoder_layers and latent_dim must be >= 1"),
            (self.vision_backbone in resnet.BLOCKS, f"--policy.vision_backbone={self.vision_backbone!r}: choose one of {', '.join(resnet.BLOCKS)}"),
            (self.feedforward_activation in ACTIVATIONS, f"--policy.feedforward_activation={self.feedforward_activation!r}: choose relu or gelu"),
            (self.temporal_ensemble_coeff is None or self.n_action_steps == 1, "--policy.temporal_ensemble_coeff needs --policy.n_action_steps=1 (it predicts every step)"),
            (self.optimizer_lr > 0, f"--policy.optimizer_lr must be > 0, got {self.optimizer_lr}"),
            (self.env_state_dim >= 0 and (not self.obs_dim or self.env_state_dim <= self.obs_dim), f"--policy.env_state_dim={self.env_state_dim} must be in [0, obs_dim={self.obs_dim}]"),
        ]  # fmt: skip
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)

    def get_optimizer_preset(self) -> AdamWConfig:
        """LeRobot's ACT preset: AdamW at optimizer_lr and optimizer_weight_decay (betas, eps and the
        clipping at 10 are AdamW's defaults), the trunk in its own group at optimizer_lr_backbone."""
        return AdamWConfig(lr=self.optimizer_lr, weight_decay=self.optimizer_weight_decay)

    def get_scheduler_preset(self) -> ConstantConfig:
        """LeRobot's ACT has no scheduler: the rate stays optimizer_lr from the first step."""
        return ConstantConfig(warmup_steps=0)

    def policy_class(self) -> type[Policy]:
        return registry.imported("trainer.policies.act.policy", "ACTPolicy")

    @classmethod
    def lerobot_adapter(cls) -> LeRobotAdapter[Any]:
        """LeRobot's ACT schema, tensor names and processors (policies/act/lerobot.py)."""
        return registry.imported("trainer.policies.act.lerobot", "ACTAdapter")()

    def normalization_stats(self, stats: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """The environment state at the end of `observation.state` left as it is (mean 0, std 1), as
        LeRobot's ACT leaves it (its normalization_mapping has no ENV entry)."""
        if not self.env_state_dim or OBS_KEY not in stats:
            return stats
        state = {name: tensor.clone() for name, tensor in stats[OBS_KEY].items()}
        state["mean"][-self.env_state_dim :], state["std"][-self.env_state_dim :] = 0.0, 1.0
        return {**stats, OBS_KEY: state}

    def with_vector_widths(self, widths: dict[str, int]) -> ACTConfig:
        """With `observation.environment_state` among the data's vectors, `env_state_dim` is its width:
        LeRobot's ACT reads it as its own token, so a run from LeRobot's flags builds LeRobot's model.
        It must come last (the model reads the end of `observation.state`); a flag or a checkpoint that
        gives another nonzero width is refused. A config whose sizes are already fixed (a checkpoint's)
        with env_state_dim 0 keeps the model it was trained as (`data_note` says so)."""
        vectors = list(widths)  # in the order the data concatenates them
        if ENV_KEY not in vectors or (self.obs_dim and not self.env_state_dim):
            return self
        if vectors[-1] != ENV_KEY:
            raise ConfigError(
                f"--policy.input_features lists {ENV_KEY} before {vectors[-1]}: ACT reads the environment "
                "state as its own token from the end of the state vector; list it last among the float vectors"
            )
        if self.env_state_dim not in (0, widths[ENV_KEY]):
            raise ConfigError(
                f"--policy.env_state_dim={self.env_state_dim}, but the data's {ENV_KEY} holds "
                f"{widths[ENV_KEY]} values: leave the flag out, it is taken from the data"
            )
        return dataclasses.replace(self, env_state_dim=widths[ENV_KEY])

    def data_note(self) -> str | None:
        """A checkpoint whose ACT reads `observation.environment_state` inside the robot state (trained
        before the environment state was its own token) is not LeRobot's ACT: said at start."""
        if ENV_KEY in self.input_features and not self.env_state_dim:
            return (
                f"this ACT reads {ENV_KEY} inside {OBS_KEY} (its checkpoint's env_state_dim is 0), not as "
                "LeRobot's ACT does (its own token, unnormalized): `trainer export` refuses it; train from "
                "scratch for LeRobot's model"
            )
        return None

    def with_frame_shapes(self, shapes: dict[str, list[int]]) -> ACTConfig:
        """The cameras' frame shapes recorded; a checkpoint's cameras at another size than the data's
        are refused (the saved trunk and its position embeddings were trained at one size)."""
        for name, shape in shapes.items():
            saved = self.image_shapes.get(name)
            if saved is not None and saved != shape:
                raise ConfigError(
                    f"camera {name!r} gives {tuple(shape)} frames, but the policy was trained on {tuple(saved)}: "
                    "resize the frames, or train a new policy"
                )
        return dataclasses.replace(self, image_shapes=shapes)
