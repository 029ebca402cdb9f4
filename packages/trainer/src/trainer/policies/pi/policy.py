"""PI0Policy and PI05Policy: LeRobot's pi0 / pi0.5 behind this engine's `Policy` interface.

A batch holds LeRobot's preprocessed keys: `observation.state` (normalized), each camera in [0, 1]
(`observation.images.<name>`, (B, C, H, W) or with a time axis), the prompt as
`observation.language.tokens` / `.attention_mask` or the raw task as `task` (tokenized here as
LeRobot's preprocessor does: language.py), and in training `action`. Cameras are resized with centred
padding to `image_resolution` and mapped to [-1, 1]; cameras the batch lacks and `empty_cameras` become
blank (-1) slots with a false mask after the ones present. `forward` returns LeRobot's loss: the
squared velocity error on the real action dimensions averaged over every chunk step (`action_is_pad`
is not used, as in LeRobot). `predict_action_chunk` samples a normalized action chunk; `select_action`
serves it from the action queue, `n_action_steps` at a time. `noise=` and `time=` fix the random draws.

Parameter names are LeRobot's (`model.paligemma_with_expert...`) but for the paired decoder layers;
LeRobot's checkpoints (and the Hub's openpi-converted ones) are renamed on read and an export writes
LeRobot's names back (weights.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch

from trainer.data.dataset import ACTION_KEY, OBS_KEY
from trainer.errors import ConfigError
from trainer.policies.common.vla.flow import sample_noise, sample_time
from trainer.policies.common.vla.images import pad_last, resize_with_pad
from trainer.policies.common.vla.policy import VLAPolicy
from trainer.policies.pi.config import PI0Config
from trainer.policies.pi.language import PiTokenizer
from trainer.policies.pi.model import PiFlowModel, Tokens

# LeRobot's default LoRA targets besides the expert's q/v projections (`_get_default_peft_targets`).
LORA_PROJECTIONS = (
    "state_proj",
    "action_in_proj",
    "action_out_proj",
    "action_time_mlp_in",
    "action_time_mlp_out",
)


class PiPolicy(VLAPolicy):
    """pi0 (`PI0Policy`) or pi0.5 (`PI05Policy`), built from its config alone."""

    # FSDP units are the modules whose forward() runs: SigLIP's patch and position embeddings and its
    # encoder layers, the token embedding, each decoder layer of either Gemma (LeRobot reads its layers'
    # weights without calling their forward(), which FSDP's hooks never see; a frozen PaliGemma's layers
    # are then never gathered in the backward pass: layers.py), each of its MLP's three projections (the
    # largest gather a third of the MLP's) and every RMSNorm (their own units, so that a bfloat16
    # policy's float32 norms never share a unit with bfloat16 weights).
    _fsdp_wrap_modules: ClassVar[tuple[str, ...]] = (
        "SiglipVisionEmbeddings", "SiglipEncoderLayer", "GemmaTextScaledWordEmbedding", "DecoderLayer",
        "MLPProjection", "PiRMSNorm",
    )  # fmt: skip
    _fsdp_forward_methods: ClassVar[tuple[str, ...]] = ("select_action", "predict_action_chunk")
    pi05: ClassVar[bool] = False

    def __init__(self, config: PI0Config) -> None:
        super().__init__(config, config.n_action_steps)
        self.config: PI0Config = config
        features = config.features()
        if not features.cameras:
            raise ConfigError(
                f"--policy.type={config.type} reads cameras: give at least one observation.images.* feature"
            )
        for what, width, flag in (("state", features.state_dim, "max_state_dim"), ("action", features.action_dim, "max_action_dim")):  # fmt: skip
            if width > getattr(config, flag):
                raise ConfigError(
                    f"the {what} has {width} values, more than --policy.{flag}={getattr(config, flag)}: raise it"
                )
        self.features = features
        self.tokenizer = PiTokenizer(config)  # before the model: a missing tokenizer is one line
        self.model = PiFlowModel(config, config.sizes())

    def peft_target_modules(self) -> tuple[str, ...]:
        """LeRobot's default LoRA targets for pi0 / pi0.5: the expert's q/v projections and the state,
        action and time projections (PaliGemma stays as it is)."""
        expert = [
            f"model.paligemma_with_expert.layers.{i}.expert.self_attn.{proj}"
            for i in range(len(self.model.paligemma_with_expert.joint_layers))
            for proj in ("q_proj", "v_proj")
        ]
        heads = [f"model.{name}" for name in LORA_PROJECTIONS if hasattr(self.model, name)]
        return (*expert, *heads)

    def initializer_of(self, module: torch.nn.Module) -> Callable[[torch.nn.Module], None] | None:
        return self.model.paligemma_with_expert.initializer_of(module)

    # ---------------------------------------------------------------- inputs

    def images(self, batch: dict[str, torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Each camera present, resized with centred padding and mapped to [-1, 1], then the blank slots."""
        present = [name for name in self.features.cameras if name in batch]
        if not present:
            raise ValueError(f"the batch holds none of the policy's cameras {list(self.features.cameras)}")
        size = self.config.image_resolution
        images, masks = [], []
        for name in present:
            image = batch[name][:, -1] if batch[name].ndim == 5 else batch[name]
            image = resize_with_pad(image.float(), size[0], size[1], centred=True)
            images.append(image * 2.0 - 1.0)
            masks.append(torch.ones(len(image), dtype=torch.bool, device=image.device))
        blanks = len(self.features.cameras) - len(present) + self.config.empty_cameras
        images += [torch.full_like(images[0], -1.0) for _ in range(blanks)]
        masks += [torch.zeros_like(masks[0]) for _ in range(blanks)]
        return images, masks

    def _state(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        state = batch[OBS_KEY]
        return (state[:, -1] if state.ndim > 2 else state).float()

    def prefix(self, batch: dict[str, torch.Tensor]) -> Tokens:
        """The prefix tokens (embeddings, pad mask, blocks) of a batch."""
        images, masks = self.images(batch)
        state = self._state(batch) if OBS_KEY in batch else None
        tokens, token_masks = self.tokenizer.batch_tokens(batch, state, images[0].device)
        return self.model.embed_prefix(images, masks, tokens, token_masks)

    def padded_state(self, batch: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """pi0's state token input, zero-padded to max_state_dim (pi0.5 reads it from the prompt)."""
        return None if self.pi05 else pad_last(self._state(batch), self.config.max_state_dim)

    # ---------------------------------------------------------------- training

    def forward(
        self,
        batch: dict[str, torch.Tensor],
        noise: torch.Tensor | None = None,
        time: torch.Tensor | None = None,
        reduction: str = "mean",
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(LeRobot's loss, metrics): the mean (per sample with reduction="none") of the element-wise
        losses on the first action_dim columns, over every chunk step."""
        actions = pad_last(batch[ACTION_KEY].float(), self.config.max_action_dim)
        if noise is None:
            noise = sample_noise(actions.shape, actions.device)
        if time is None:
            c = self.config
            time = sample_time(
                actions.shape[0], actions.device, c.time_sampling_beta_alpha, c.time_sampling_beta_beta,
                c.time_sampling_scale, c.time_sampling_offset,
            )  # fmt: skip
        losses = self.elementwise_losses(batch, actions, noise, time)[:, :, : self.features.action_dim]
        metrics = {"loss_per_dim": losses.detach().mean(dim=(0, 1))}
        return (losses.mean(dim=(1, 2)) if reduction == "none" else losses.mean()), metrics

    def elementwise_losses(
        self, batch: dict[str, torch.Tensor], actions: torch.Tensor, noise: torch.Tensor, time: torch.Tensor
    ) -> torch.Tensor:
        """(B, chunk, max_action_dim) squared velocity errors for padded `actions` (LeRobot's PI0Pytorch.forward)."""
        return self.model.losses(self.prefix(batch), self.padded_state(batch), actions, noise, time)

    # ---------------------------------------------------------------- acting

    @torch.no_grad()
    def predict_action_chunk(
        self, batch: dict[str, torch.Tensor], noise: torch.Tensor | None = None
    ) -> torch.Tensor:
        """A normalized action chunk (B, chunk_size, action_dim) from noise (B, chunk_size, max_action_dim)."""
        self.eval()
        prefix = self.prefix(batch)
        if noise is None:
            shape = (prefix[0].shape[0], self.config.chunk_size, self.config.max_action_dim)
            noise = sample_noise(shape, prefix[0].device)
        return self.model.sample(prefix, self.padded_state(batch), noise)[:, :, : self.features.action_dim]


class PI0Policy(PiPolicy):
    """LeRobot's pi0: the state as a token of the expert, the time concatenated to the action tokens."""


class PI05Policy(PiPolicy):
    """LeRobot's pi0.5: the state in the prompt, the time in the expert's adaptive norms."""

    pi05 = True
