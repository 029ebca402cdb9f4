"""ACT (Action Chunking with Transformers) as LeRobot builds it, with LeRobot's flag names and defaults.

Per camera, the frames go through a ResNet trunk (policies/resnet.py; one trunk shared by all cameras,
as in LeRobot), a 1x1 convolution to `dim_model`, and 2-D sinusoidal position embeddings; each feature
map cell is a token. The transformer encoder reads [latent token, state token, camera tokens]; the
decoder turns `chunk_size` learned positions into a chunk of actions (L1 loss, padded steps masked).

In training with `use_vae`, a CVAE encoder reads [CLS, state, the target action chunk] and gives the
latent's mean and log-variance; the loss adds `kl_weight` x KL divergence to a unit Gaussian. At run
time the latent is zero. `select_action` runs the model once per `n_action_steps` actions (an action
queue), or every step with `temporal_ensemble_coeff` (a weighted mean of every chunk's prediction for
the current step, weights exp(-coeff * i), i = 0 the oldest).

Attention is our own module with separate q/k/v/out projections (LeRobot uses `nn.MultiheadAttention`,
whose fused input projection LoRA cannot target); the layer arithmetic (post-norm by default,
`pre_norm`, positions added to queries and keys only) is LeRobot's. The transformer layers and the
trunk's stages are the FSDP wrap units.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from trainer.config.optim import AdamWConfig, ConstantConfig
from trainer.config.policy import PolicyConfig
from trainer.data.dataset import ACTION_KEY, ALL_CAMERAS, OBS_KEY, PAD_KEY, is_camera
from trainer.data.pipeline import lerobot_schema
from trainer.errors import ConfigError
from trainer.policies import act_lerobot, resnet
from trainer.policies.base import Policy

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"relu": F.relu, "gelu": F.gelu}


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
    of the input features): read as a token of its own, as LeRobot's ACT does; 0 reads the whole state
    as one token. Set from a LeRobot checkpoint's config.json."""

    def __post_init__(self) -> None:
        super().__post_init__()
        checks = [
            (self.dim_model % self.n_heads == 0, f"--policy.dim_model={self.dim_model} must be divisible by --policy.n_heads={self.n_heads}"),
            (self.n_obs_steps == 1, f"--policy.n_obs_steps={self.n_obs_steps}: ACT reads one observation step"),
            (1 <= self.n_action_steps <= self.chunk_size, f"--policy.n_action_steps={self.n_action_steps} must be in [1, --policy.chunk_size={self.chunk_size}]"),
            (min(self.n_encoder_layers, self.n_decoder_layers, self.n_vae_encoder_layers, self.latent_dim) >= 1, "--policy.n_encoder_layers, n_decoder_layers, n_vae_encoder_layers and latent_dim must be >= 1"),
            (self.vision_backbone in resnet.BLOCKS, f"--policy.vision_backbone={self.vision_backbone!r}: choose one of {', '.join(resnet.BLOCKS)}"),
            (self.feedforward_activation in _ACTIVATIONS, f"--policy.feedforward_activation={self.feedforward_activation!r}: choose relu or gelu"),
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
        return ACTPolicy

    @classmethod
    def from_saved(cls, saved: dict[str, Any], preprocessor: dict[str, Any] | None = None) -> dict[str, Any]:
        """A LeRobot ACT config.json as our fields (act_lerobot.py); ours as it is."""
        return act_lerobot.config_from_lerobot(saved)

    def lerobot_config(self) -> dict[str, Any]:
        """LeRobot's ACTConfig schema (act_lerobot.py); config.json itself stays ours, see docs/vla.md."""
        return act_lerobot.config_to_lerobot(dataclasses.asdict(self))

    def lerobot_pipeline(self) -> lerobot_schema.LeRobotPipeline:
        """LeRobot's `make_act_pre_post_processors`: rename, batch axis, device, then the normalizer over
        the inputs and the action, every type MEAN_STD but the environment state (no ENV entry)."""
        features = act_lerobot.input_features(dataclasses.asdict(self))
        features[ACTION_KEY] = {"type": "ACTION", "shape": [self.action_dim]}
        before = (lerobot_schema.rename(), lerobot_schema.to_batch(), lerobot_schema.device())
        return lerobot_schema.LeRobotPipeline(before, features, dict(act_lerobot.MEAN_STD))

    def normalization_stats(self, stats: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """The environment state at the end of `observation.state` left as it is (mean 0, std 1), as
        LeRobot's ACT leaves it (its normalization_mapping has no ENV entry)."""
        if not self.env_state_dim or OBS_KEY not in stats:
            return stats
        state = {name: tensor.clone() for name, tensor in stats[OBS_KEY].items()}
        state["mean"][-self.env_state_dim :], state["std"][-self.env_state_dim :] = 0.0, 1.0
        return {**stats, OBS_KEY: state}

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


class ACTAttention(nn.Module):
    """Multi-head attention with separate q/k/v/out projections; `keep` masks keys (True = attend)."""

    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(dim, dim) for _ in range(4))

    def forward(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, keep: torch.Tensor | None = None
    ) -> torch.Tensor:
        b, n, d = query.shape

        def split(x: torch.Tensor) -> torch.Tensor:
            return x.view(b, x.shape[1], self.heads, -1).transpose(1, 2)

        mask = None if keep is None else keep[:, None, None, :]
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(
            split(self.q_proj(query)), split(self.k_proj(key)), split(self.v_proj(value)), mask, p
        )
        return self.out_proj(y.transpose(1, 2).reshape(b, n, d))


class _FeedForward(nn.Module):
    def __init__(self, cfg: ACTConfig) -> None:
        super().__init__()
        self.linear1 = nn.Linear(cfg.dim_model, cfg.dim_feedforward)
        self.linear2 = nn.Linear(cfg.dim_feedforward, cfg.dim_model)
        self.dropout = nn.Dropout(cfg.dropout)
        self.activation = _ACTIVATIONS[cfg.feedforward_activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(self.dropout(self.activation(self.linear1(x))))


class ACTEncoderLayer(nn.Module):
    """Self-attention (positions on queries and keys) and feed-forward, each with a residual."""

    def __init__(self, cfg: ACTConfig) -> None:
        super().__init__()
        self.self_attn = ACTAttention(cfg.dim_model, cfg.n_heads, cfg.dropout)
        self.ffn = _FeedForward(cfg)
        self.norm1, self.norm2 = nn.LayerNorm(cfg.dim_model), nn.LayerNorm(cfg.dim_model)
        self.dropout1, self.dropout2 = nn.Dropout(cfg.dropout), nn.Dropout(cfg.dropout)
        self.pre_norm = cfg.pre_norm

    def forward(self, x: torch.Tensor, pos: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        h = self.norm1(x) if self.pre_norm else x
        x = x + self.dropout1(self.self_attn(h + pos, h + pos, h, keep))
        if self.pre_norm:
            return x + self.dropout2(self.ffn(self.norm2(x)))
        x = self.norm1(x)
        return self.norm2(x + self.dropout2(self.ffn(x)))


class ACTDecoderLayer(nn.Module):
    """Self-attention over the chunk's positions, cross-attention to the encoder, feed-forward."""

    def __init__(self, cfg: ACTConfig) -> None:
        super().__init__()
        self.self_attn = ACTAttention(cfg.dim_model, cfg.n_heads, cfg.dropout)
        self.multihead_attn = ACTAttention(cfg.dim_model, cfg.n_heads, cfg.dropout)
        self.ffn = _FeedForward(cfg)
        self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(cfg.dim_model) for _ in range(3))
        self.dropout1, self.dropout2, self.dropout3 = (nn.Dropout(cfg.dropout) for _ in range(3))
        self.pre_norm = cfg.pre_norm

    def forward(
        self, x: torch.Tensor, memory: torch.Tensor, pos: torch.Tensor, memory_pos: torch.Tensor
    ) -> torch.Tensor:
        h = self.norm1(x) if self.pre_norm else x
        x = x + self.dropout1(self.self_attn(h + pos, h + pos, h))
        h = self.norm2(x) if self.pre_norm else self.norm1(x)
        x = (x if self.pre_norm else h) + self.dropout2(
            self.multihead_attn(h + pos, memory + memory_pos, memory)
        )
        h = self.norm3(x) if self.pre_norm else self.norm2(x)
        x = (x if self.pre_norm else h) + self.dropout3(self.ffn(h))
        return x if self.pre_norm else self.norm3(x)


class ACTEncoder(nn.Module):
    def __init__(self, cfg: ACTConfig, layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(ACTEncoderLayer(cfg) for _ in range(layers))
        self.norm = nn.LayerNorm(cfg.dim_model) if cfg.pre_norm else nn.Identity()

    def forward(self, x: torch.Tensor, pos: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, pos, keep)
        return self.norm(x)


class ACTDecoder(nn.Module):
    def __init__(self, cfg: ACTConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(ACTDecoderLayer(cfg) for _ in range(cfg.n_decoder_layers))
        self.norm = nn.LayerNorm(cfg.dim_model)

    def forward(
        self, x: torch.Tensor, memory: torch.Tensor, pos: torch.Tensor, memory_pos: torch.Tensor
    ) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, memory, pos, memory_pos)
        return self.norm(x)


def sinusoidal_1d(positions: int, dim: int) -> torch.Tensor:
    """(positions, dim) fixed embedding: sin on even channels, cos on odd, periods up to 10000; in
    float64 throughout, then float32, so it equals LeRobot's numpy table (the buffer its checkpoints
    store, and ours write for it) bit for bit."""
    exponent = 2 * (torch.arange(dim, dtype=torch.float64) // 2) / dim
    angles = torch.arange(positions, dtype=torch.float64)[:, None] / 10000 ** exponent[None, :]
    return torch.where(torch.arange(dim) % 2 == 0, angles.sin(), angles.cos()).float()


def sinusoidal_2d(height: int, width: int, dim: int) -> torch.Tensor:
    """(dim, height, width) embedding of a feature map: half the channels encode the row, half the
    column, each position normalized to (0, 2*pi] (DETR's, as LeRobot's ACT uses)."""
    half = dim // 2
    scale = 2 * math.pi
    rows = torch.arange(1, height + 1, dtype=torch.float32) / (height + 1e-6) * scale
    cols = torch.arange(1, width + 1, dtype=torch.float32) / (width + 1e-6) * scale
    frequency = 10000 ** (2 * (torch.arange(half) // 2) / half)

    def embed(values: torch.Tensor) -> torch.Tensor:  # (n,) -> (n, half), sin/cos interleaved
        angles = values[:, None] / frequency
        return torch.stack((angles[:, 0::2].sin(), angles[:, 1::2].cos()), dim=-1).flatten(1)

    y = embed(rows)[:, None, :].expand(height, width, half)
    x = embed(cols)[None, :, :].expand(height, width, half)
    return torch.cat((y, x), dim=-1).permute(2, 0, 1)


class TemporalEnsembler:
    """The online form of ACT's temporal ensembling: each step's action is the weighted mean of what
    every chunk predicted for that step, weight exp(-coeff * i) with i = 0 the oldest chunk."""

    def __init__(self, coeff: float, chunk_size: int) -> None:
        self.weights = torch.exp(-coeff * torch.arange(chunk_size, dtype=torch.float64))
        self.cumulative = self.weights.cumsum(0)
        self.reset()

    def reset(self) -> None:
        self.mean: torch.Tensor | None = None  # (B, steps left, action_dim)
        self.count = torch.zeros(0, dtype=torch.long)  # predictions averaged into each step

    def update(self, chunk: torch.Tensor) -> torch.Tensor:
        chunk = chunk.double()
        if self.mean is None:
            self.mean, self.count = chunk, torch.ones(chunk.shape[1], dtype=torch.long)
        else:
            w, c = self.weights.to(chunk.device), self.cumulative.to(chunk.device)
            n = self.count.to(chunk.device)
            old = self.mean * c[n - 1][None, :, None] + chunk[:, :-1] * w[n][None, :, None]
            self.mean = torch.cat([old / c[n][None, :, None], chunk[:, -1:]], dim=1)
            self.count = torch.cat([(n + 1).clamp_max(len(w)), n.new_ones(1)]).cpu()
        action, self.mean, self.count = self.mean[:, 0], self.mean[:, 1:], self.count[1:]
        return action.float()


class ACTPolicy(Policy):
    """The module names follow LeRobot's ACT (`backbone`, `encoder_img_feat_input_proj`,
    `vae_encoder_*`, ...) without its `model.` prefix; the trunk exists only when a camera is among the
    input features, the state projections only when there is a state vector, the environment state's
    (`encoder_env_state_input_proj`) only with `env_state_dim`. LeRobot's own checkpoints load through
    `adapt_state_dict` (act_lerobot.py: its fused attention projections split)."""

    _fsdp_wrap_modules: ClassVar[tuple[str, ...]] = ("ACTEncoderLayer", "ACTDecoderLayer", "ResNetStage")
    _fsdp_forward_methods: ClassVar[tuple[str, ...]] = ("select_action",)
    vae_encoder_pos_enc: torch.Tensor

    def peft_target_modules(self) -> tuple[str, ...]:
        """LoRA on every attention projection."""
        return ("q_proj", "k_proj", "v_proj", "out_proj")

    def __init__(self, config: ACTConfig) -> None:
        super().__init__(config)
        self.config: ACTConfig = config
        d = config.dim_model
        self.cameras = [n for n in config.input_features if is_camera(n) and n != ALL_CAMERAS]
        if not self.cameras and not config.obs_dim:
            raise ConfigError(
                "--policy.type=act needs a camera or a state vector among --policy.input_features"
            )
        if self.cameras:
            self.backbone = resnet.ResNetTrunk(
                config.vision_backbone, config.replace_final_stride_with_dilation
            )
            self.encoder_img_feat_input_proj = nn.Conv2d(resnet.FEATURE_CHANNELS, d, 1)
        self.robot_dim = config.obs_dim - config.env_state_dim
        has_state = self.robot_dim > 0
        if has_state:
            self.encoder_robot_state_input_proj = nn.Linear(self.robot_dim, d)
        if config.env_state_dim:
            self.encoder_env_state_input_proj = nn.Linear(config.env_state_dim, d)
        self.encoder_latent_input_proj = nn.Linear(config.latent_dim, d)
        self.encoder_1d_feature_pos_embed = nn.Embedding(1 + has_state + (config.env_state_dim > 0), d)
        self.encoder = ACTEncoder(config, config.n_encoder_layers)
        self.decoder = ACTDecoder(config)
        self.decoder_pos_embed = nn.Embedding(config.chunk_size, d)
        self.action_head = nn.Linear(d, config.action_dim)
        if config.use_vae:
            self.vae_encoder = ACTEncoder(config, config.n_vae_encoder_layers)
            self.vae_encoder_cls_embed = nn.Embedding(1, d)
            if has_state:
                self.vae_encoder_robot_state_input_proj = nn.Linear(self.robot_dim, d)
            self.vae_encoder_action_input_proj = nn.Linear(config.action_dim, d)
            self.vae_encoder_latent_output_proj = nn.Linear(d, 2 * config.latent_dim)
            self.register_buffer("vae_encoder_pos_enc", self._vae_positions(), persistent=False)
        self._queue: collections.deque[torch.Tensor] = collections.deque(maxlen=config.n_action_steps)
        coeff = config.temporal_ensemble_coeff
        self._ensembler = None if coeff is None else TemporalEnsembler(coeff, config.chunk_size)

    def _latent(self, batch: dict[str, torch.Tensor], b: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The CVAE latent of a training batch (and its mean/log-variance), or zeros."""
        if not (self.config.use_vae and self.training and ACTION_KEY in batch):
            return self._zeros(b), None
        tokens = [self.vae_encoder_cls_embed.weight.expand(b, 1, -1)]
        if self.robot_dim:
            tokens.append(self.vae_encoder_robot_state_input_proj(self._robot_state(batch))[:, None])
        actions = self.vae_encoder_action_input_proj(batch[ACTION_KEY])
        tokens.append(actions)
        keep = torch.cat(
            [torch.ones(b, len(tokens) - 1, dtype=torch.bool, device=actions.device), ~batch[PAD_KEY]], dim=1
        )
        out = self.vae_encoder(torch.cat(tokens, dim=1), self.vae_encoder_pos_enc.to(actions.dtype), keep)
        params = self.vae_encoder_latent_output_proj(out[:, 0])
        mu, log_sigma_x2 = params.chunk(2, dim=-1)
        latent = mu + (log_sigma_x2 / 2).exp() * torch.randn_like(mu)
        return latent, params

    def _robot_state(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return batch[OBS_KEY][:, : self.robot_dim]

    def _zeros(self, b: int) -> torch.Tensor:
        weight = self.encoder_latent_input_proj.weight
        return torch.zeros(b, self.config.latent_dim, dtype=weight.dtype, device=weight.device)

    def _predict(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(action chunk (B, chunk_size, action_dim), the CVAE's mean/log-variance or None)."""
        self._check_frames(batch)
        b = len(next(iter(batch.values())))
        latent, params = self._latent(batch, b)
        tokens = [self.encoder_latent_input_proj(latent)[:, None]]
        if self.robot_dim:
            tokens.append(self.encoder_robot_state_input_proj(self._robot_state(batch))[:, None])
        if self.config.env_state_dim:
            env = batch[OBS_KEY][:, self.robot_dim :]
            tokens.append(self.encoder_env_state_input_proj(env)[:, None])
        pos = [self.encoder_1d_feature_pos_embed.weight[None]]
        for name in self.cameras:
            features = self.encoder_img_feat_input_proj(self.backbone(batch[name]))  # (B, d, h, w)
            _, d, h, w = features.shape
            tokens.append(features.flatten(2).transpose(1, 2))
            embed = sinusoidal_2d(h, w, d).to(features.device, features.dtype)
            pos.append(embed.flatten(1).transpose(0, 1)[None])
        memory_pos = torch.cat(pos, dim=1)
        memory = self.encoder(torch.cat(tokens, dim=1), memory_pos)
        queries = self.decoder_pos_embed.weight[None]
        x = self.decoder(torch.zeros_like(queries).expand(b, -1, -1), memory, queries, memory_pos)
        return self.action_head(x), params

    def _check_frames(self, batch: dict[str, torch.Tensor]) -> None:
        for name in self.cameras:
            if name not in batch:
                raise ValueError(f"the batch lacks camera {name!r}; the policy reads {self.cameras}")
            shape, want = list(batch[name].shape[1:]), self.config.image_shapes.get(name)
            if want is not None and shape != want:
                raise ValueError(
                    f"camera {name!r}: frames of shape {tuple(shape)}, the policy takes {tuple(want)}"
                )

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        pred, params = self._predict(batch)
        valid = (~batch[PAD_KEY]).unsqueeze(-1).to(pred.dtype)
        l1 = ((batch[ACTION_KEY] - pred).abs() * valid).mean()  # LeRobot's: padded steps count as 0
        metrics = {"l1_loss": l1.detach()}
        if params is None:
            return l1, metrics
        mu, log_sigma_x2 = params.chunk(2, dim=-1)
        kld = (-0.5 * (1 + log_sigma_x2 - mu.square() - log_sigma_x2.exp())).sum(-1).mean()
        metrics["kld_loss"] = kld.detach()
        return l1 + self.config.kl_weight * kld, metrics

    @torch.no_grad()
    def predict_chunk(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The whole predicted action chunk (B, chunk_size, action_dim) for normalized observations."""
        return self._predict(batch)[0]

    @torch.no_grad()
    def select_action(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if self._ensembler is not None:
            return self._ensembler.update(self.predict_chunk(batch))
        if not self._queue:
            chunk = self.predict_chunk(batch)[:, : self.config.n_action_steps]
            self._queue.extend(chunk.transpose(0, 1))
        return self._queue.popleft()

    def reset(self) -> None:
        self._queue.clear()
        if self._ensembler is not None:
            self._ensembler.reset()

    @classmethod
    def adapt_state_dict(cls, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """LeRobot's ACT weights under our names; ours (or a legacy checkpoint's) as they are."""
        return act_lerobot.state_from_lerobot(state) if act_lerobot.is_lerobot_state(state) else state

    @classmethod
    def saved_under_other_names(cls, names: Collection[str]) -> bool:
        return act_lerobot.is_lerobot_state(names)

    def lerobot_state_dict(self) -> dict[str, torch.Tensor]:
        """Our weights under LeRobot's names, its fused projections and its persistent CVAE table."""
        pos_enc = self.vae_encoder_pos_enc if self.config.use_vae else None
        return act_lerobot.state_to_lerobot(self.state_dict(), pos_enc)

    def load_pretrained_parts(self) -> None:
        weights = self.config.pretrained_backbone_weights
        if self.cameras and weights is not None:
            resnet.load_pretrained(self.backbone, weights)

    def loads_pretrained_parts(self) -> bool:
        return bool(self.cameras) and self.config.pretrained_backbone_weights is not None

    def reset_parameters(self) -> None:
        """The policy's own tensor: the VAE encoder's sinusoidal table, recomputed (a meta build)."""
        if self.config.use_vae:
            self.vae_encoder_pos_enc.copy_(self._vae_positions())

    def _vae_positions(self) -> torch.Tensor:
        """The CVAE encoder's tokens: [CLS, the robot state if any, the action chunk] (LeRobot's count:
        an environment state alone adds no token there)."""
        tokens = 1 + (self.robot_dim > 0) + self.config.chunk_size
        return sinusoidal_1d(tokens, self.config.dim_model)[None]

    def parameter_groups(self) -> dict[str, float]:
        return {"backbone": self.config.optimizer_lr_backbone} if self.cameras else {}
