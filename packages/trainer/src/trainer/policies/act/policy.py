"""`ACTPolicy`: LeRobot's ACT model (camera trunk, CVAE, encoder-decoder), its L1 + KL loss, the action
queue or temporal ensembling at run time, and the hooks the engine reads (FSDP units, LoRA targets,
the trunk's pretrained weights and learning rate, LeRobot's tensor names)."""

from __future__ import annotations

import collections
from typing import ClassVar

import torch
from torch import nn

from trainer.data.dataset import ACTION_KEY, ALL_CAMERAS, OBS_KEY, PAD_KEY, is_camera
from trainer.errors import ConfigError
from trainer.policies.act.config import ACTConfig
from trainer.policies.act.modules import (
    ACTDecoder,
    ACTEncoder,
    TemporalEnsembler,
    sinusoidal_1d,
    sinusoidal_2d,
)
from trainer.policies.common import resnet
from trainer.policies.common.base import Policy


class ACTPolicy(Policy):
    """The module names follow LeRobot's ACT (`backbone`, `encoder_img_feat_input_proj`,
    `vae_encoder_*`, ...) without its `model.` prefix; the trunk exists only when a camera is among the
    input features, the state projections only when there is a state vector, the environment state's
    (`encoder_env_state_input_proj`) only with `env_state_dim`. LeRobot's own checkpoints load through
    its LeRobot adapter (policies/act/lerobot.py: its fused attention projections split)."""

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
