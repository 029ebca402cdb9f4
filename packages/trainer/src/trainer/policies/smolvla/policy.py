"""SmolVLAPolicy: LeRobot's SmolVLA behind this engine's `Policy` interface.

A batch holds LeRobot's preprocessed keys: `observation.state` (normalized), each camera in [0, 1]
(`observation.images.<name>`, (B, C, H, W) or with a time axis), the task as
`observation.language.tokens` / `observation.language.attention_mask`, or as raw text under `task`
(tokenized here as LeRobot's preprocessor does: language.py), and in training `action` /
`action_is_pad`. `forward` returns LeRobot's loss (the squared velocity error over the valid steps and
the real action dimensions); `predict_action_chunk` samples a chunk; `select_action` serves it from
the action queue, `n_action_steps` at a time. `noise=` and `time=` fix the random draws, as in LeRobot.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch

from trainer.data.dataset import (
    ACTION_DIM_PAD_KEY,
    ACTION_KEY,
    CAMERA_MASK_SUFFIX,
    OBS_KEY,
    PAD_KEY,
    STATE_DIM_PAD_KEY,
)
from trainer.errors import ConfigError
from trainer.policies.common.vla.flow import sample_noise, sample_time
from trainer.policies.common.vla.images import pad_last, resize_with_pad
from trainer.policies.common.vla.policy import VLAPolicy
from trainer.policies.smolvla import backbone, language
from trainer.policies.smolvla.config import SmolVLAConfig
from trainer.policies.smolvla.flow import FlowMatching


class SmolVLAPolicy(VLAPolicy):
    """Parameter names are LeRobot's (`model.vlm_with_expert.vlm...`, `model.state_proj`, ...)."""

    # FSDP units are modules whose forward() runs: a vision encoder layer, and in the text and expert
    # decoder layers, whose own forward() is never called (joint.py), their MLPs and every projection
    # (Linear); the norms stay in the root unit. A unit per decoder layer would never be gathered by its
    # own hooks (tests/distributed/test_smolvla_sharded.py shows it failing). The embeddings (the
    # vision tower's positions, the token table) are units too: FSDP2 shards the token table by rows
    # apart from the root and the policy reads it on each rank's rows, never gathering it
    # (policies/common/vocab_parallel.py); the positions' unit runs its forward.
    _fsdp_wrap_modules: ClassVar[tuple[str, ...]] = ("SmolVLMEncoderLayer", "LlamaMLP", "Linear", "Embedding")
    _fsdp_forward_methods: ClassVar[tuple[str, ...]] = ("select_action", "predict_action_chunk")

    def __init__(self, config: SmolVLAConfig) -> None:
        super().__init__(config, config.n_action_steps)
        self.config: SmolVLAConfig = config
        self.cameras = config.cameras
        if not self.cameras:
            raise ConfigError("--policy.type=smolvla needs at least one camera among --policy.input_features")
        vlm = backbone.vlm_config(config)
        self.tokenizer = language.Tokenizer(config)  # before the model: a missing tokenizer is one line
        self.model = FlowMatching(config, vlm, self.tokenizer.image_token_ids())

    def peft_target_modules(self) -> tuple[str, ...]:
        """LeRobot's default LoRA targets for SmolVLA: the expert's q/v projections and the state,
        action and time projections (the VLM stays as it is)."""
        expert = [
            f"model.vlm_with_expert.lm_expert.layers.{i}.self_attn.{proj}"
            for i in range(len(self.model.vlm_with_expert.lm_expert.layers))
            for proj in ("q_proj", "v_proj")
        ]
        heads = (
            "state_proj",
            "action_in_proj",
            "action_out_proj",
            "action_time_mlp_in",
            "action_time_mlp_out",
        )
        return (*expert, *(f"model.{name}" for name in heads))

    @property
    def _dtype(self) -> torch.dtype:
        """The policy's float dtype (float32 unless --policy.dtype casts it): inputs enter in it."""
        return self.model.state_proj.weight.dtype

    # ---------------------------------------------------------------- inputs

    def _images(self, batch: dict[str, torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Each camera resized with padding and mapped to [-1, 1], with its (all-true) mask, then
        `empty_cameras` blank slots."""
        present = [name for name in self.cameras if name in batch]
        if not present:
            raise ValueError(f"the batch holds none of the policy's cameras {self.cameras}")
        images, masks = [], []
        for name in present:
            image = batch[name][:, -1] if batch[name].ndim == 5 else batch[name]
            size = self.config.resize_imgs_with_padding
            if size is not None:
                image = resize_with_pad(image, size[1], size[0])
            images.append((image * 2.0 - 1.0).to(self._dtype))
            masks.append(
                batch.get(
                    name + CAMERA_MASK_SUFFIX, torch.ones(len(image), dtype=torch.bool, device=image.device)
                ).bool()
            )
        # LeRobot adds `empty_cameras` camera names no batch holds, so every call appends that many
        # blank slots (-1, masked out) after the cameras present
        for _ in range(self.config.empty_cameras):
            images.append(torch.ones_like(images[-1]) * -1)
            masks.append(torch.zeros_like(masks[-1]))
        return images, masks

    def _prefix(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        images, masks = self._images(batch)
        state = batch[OBS_KEY]
        state = state[:, -1] if state.ndim > 2 else state
        if STATE_DIM_PAD_KEY in batch:  # a mixture's smaller robot: its padded values stay 0 once normalized
            state = state.masked_fill(batch[STATE_DIM_PAD_KEY], 0.0)
        if state.shape[-1] > self.config.max_state_dim:
            raise ValueError(
                f"the state has {state.shape[-1]} values, more than max_state_dim={self.config.max_state_dim}"
            )
        tokens, token_masks = self.tokenizer.batch_tokens(batch, state.device)
        return self.model.embed_prefix(
            images, masks, tokens, token_masks, pad_last(state.to(self._dtype), self.config.max_state_dim)
        )

    # ---------------------------------------------------------------- training

    def forward(
        self,
        batch: dict[str, torch.Tensor],
        noise: torch.Tensor | None = None,
        time: torch.Tensor | None = None,
        reduction: str = "mean",
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """LeRobot's loss: the element-wise squared velocity error on the real action dimensions,
        summed over the steps that are not padding and divided by their number x action_dim (per
        sample with reduction="none"); with `action_dim_is_pad` (a mixture of members that differ)
        over each item's own dims (`_masked_loss`)."""
        actions = pad_last(batch[ACTION_KEY].to(self._dtype), self.config.max_action_dim)
        if noise is None:
            noise = sample_noise(actions.shape, actions.device)
        if time is None:
            time = sample_time(actions.shape[0], actions.device)
        losses = self.model.losses(self._prefix(batch), actions, noise.to(self._dtype), time)[
            :, :, : self.config.action_dim
        ]
        metrics = {"losses_after_forward": losses.detach().mean()}
        pad = batch.get(PAD_KEY)
        if ACTION_DIM_PAD_KEY in batch:
            return _masked_loss(losses, pad, batch[ACTION_DIM_PAD_KEY], reduction), metrics
        if pad is not None:
            losses = losses * (~pad).unsqueeze(-1)
        dims = losses.shape[-1]
        if reduction == "none":
            valid = (dims * (~pad).sum(dim=1)).clamp_min(1) if pad is not None else dims * losses.shape[1]
            return losses.sum(dim=(1, 2)) / valid, metrics
        valid = (dims * (~pad).sum()).clamp_min(1) if pad is not None else losses.numel()
        return losses.sum() / valid, metrics

    # ---------------------------------------------------------------- acting

    @torch.no_grad()
    def predict_action_chunk(
        self, batch: dict[str, torch.Tensor], noise: torch.Tensor | None = None
    ) -> torch.Tensor:
        """A sampled action chunk (B, chunk_size, action_dim), normalized."""
        self.eval()
        prefix = self._prefix(batch)
        b = prefix[0].shape[0]
        if noise is None:
            shape = (b, self.config.chunk_size, self.config.max_action_dim)
            noise = sample_noise(shape, prefix[0].device)
        return self.model.sample(prefix, noise.to(self._dtype))[:, :, : self.config.action_dim]

    def load_pretrained_parts(self) -> None:
        if self.config.load_vlm_weights:
            self.model.vlm_with_expert.load_backbone_weights(self.config.vlm_model_name)

    def loads_pretrained_parts(self) -> bool:
        """Random backbone weights (LeRobot's default, and every `--policy.path` run) build on meta."""
        return self.config.load_vlm_weights

    def initializer_of(self, module: torch.nn.Module) -> Callable[[torch.nn.Module], None] | None:
        return self.model.vlm_with_expert.initializer_of(module)


def _masked_loss(
    losses: torch.Tensor, pad: torch.Tensor | None, dim_pad: torch.Tensor, reduction: str
) -> torch.Tensor:
    """The loss over each item's own action dims (a mixture of members that differ,
    data/pipeline/embodiments.py): padded dims multiplied by 0, so they add no loss and exactly zero
    gradient, and each item's valid count is its valid steps x its own action size."""
    steps = (
        (~pad) if pad is not None else torch.ones(losses.shape[:2], dtype=torch.bool, device=losses.device)
    )
    valid = steps.unsqueeze(-1) & ~dim_pad[:, None, : losses.shape[-1]]
    losses = losses * valid
    if reduction == "none":
        return losses.sum(dim=(1, 2)) / valid.sum(dim=(1, 2)).clamp_min(1)
    return losses.sum() / valid.sum().clamp_min(1)
