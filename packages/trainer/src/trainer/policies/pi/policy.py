"""PiPolicy: LeRobot's pi0 / pi0.5 built from a config and the data's features, on LeRobot's batches.

A batch holds LeRobot's preprocessed keys: `observation.state` (normalized), each camera in [0, 1]
(`observation.images.<name>`, (B, C, H, W) or with a time axis), the prompt as
`observation.language.tokens` / `.attention_mask` or the raw task as `task` (tokenized here as
LeRobot's preprocessor does: language.py), and in training `action`. Cameras are resized with centred
padding to `image_resolution` and mapped to [-1, 1]; cameras the batch lacks and `empty_cameras` become
blank (-1) slots with a false mask after the ones present. `forward` returns LeRobot's loss: the
squared velocity error on the real action dimensions averaged over every chunk step (`action_is_pad`
is not used, as in LeRobot). `sample_actions` returns a normalized action chunk. `noise=` and `time=`
fix the random draws.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import torch
from torch import nn

from trainer.data.dataset import ACTION_KEY, OBS_KEY
from trainer.errors import ConfigError
from trainer.policies.pi import weights
from trainer.policies.pi.config import Features, PI0Config
from trainer.policies.pi.language import PiTokenizer
from trainer.policies.pi.model import PiFlowModel, Tokens
from trainer.policies.vla.flow import sample_noise, sample_time
from trainer.policies.vla.images import pad_last, resize_with_pad


class PiPolicy(nn.Module):
    """Parameter names are LeRobot's (`model.paligemma_with_expert...`) but for the paired decoder
    layers (weights.py maps them)."""

    # FSDP units: SigLIP's encoder layers and the joint decoder layers, the modules whose forward() runs.
    fsdp_wrap_modules: ClassVar[tuple[str, ...]] = ("SiglipEncoderLayer", "JointLayer")
    # Entry points besides forward() that must gather the root unit's parameters first.
    fsdp_forward_methods: ClassVar[tuple[str, ...]] = ("sample_actions",)

    def __init__(self, config: PI0Config, features: Features) -> None:
        super().__init__()
        if not features.cameras:
            raise ConfigError("pi0 and pi05 read cameras: give at least one observation.images.* feature")
        for what, width, flag in (("state", features.state_dim, "max_state_dim"), ("action", features.action_dim, "max_action_dim")):  # fmt: skip
            if width > getattr(config, flag):
                raise ConfigError(
                    f"the {what} has {width} values, more than --policy.{flag}={getattr(config, flag)}: raise it"
                )
        self.config, self.features = config, features
        self.tokenizer = PiTokenizer(config)  # before the model: a missing tokenizer is one line
        self.model = PiFlowModel(config, config.sizes())

    @classmethod
    def from_lerobot(cls, directory: str | Path, **ours: object) -> PiPolicy:
        """A LeRobot `pretrained_model/` (config.json + model.safetensors), loaded strictly; `ours`
        sets this config's own fields (size_overrides; tokenizer_name, else the one its
        policy_preprocessor.json names, as LeRobot reads it)."""
        import json

        from safetensors.torch import load_file

        directory = Path(directory)
        preprocessor = directory / "policy_preprocessor.json"
        if "tokenizer_name" not in ours and preprocessor.is_file():
            steps = json.loads(preprocessor.read_text()).get("steps", [])
            names = [
                s["config"]["tokenizer_name"]
                for s in steps
                if s.get("registry_name") == "tokenizer_processor"
            ]
            ours = {**ours, **({"tokenizer_name": names[0]} if names else {})}
        config, features = PI0Config.from_lerobot(json.loads((directory / "config.json").read_text()), **ours)
        policy = cls(config, features)
        weights.load_lerobot(policy, load_file(str(directory / "model.safetensors")), config, str(directory))
        return policy.eval()

    def lerobot_state_dict(self) -> dict[str, torch.Tensor]:
        """The weights under LeRobot's names, lm_heads included (what its strict load needs)."""
        return weights.to_lerobot(self.state_dict(), self.config.sizes())

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
        return state[:, -1] if state.ndim > 2 else state

    def prefix(self, batch: dict[str, torch.Tensor]) -> Tokens:
        """The prefix tokens (embeddings, pad mask, blocks) of a batch."""
        images, masks = self.images(batch)
        state = self._state(batch) if OBS_KEY in batch else None
        tokens, token_masks = self.tokenizer.batch_tokens(batch, state, images[0].device)
        return self.model.embed_prefix(images, masks, tokens, token_masks)

    def padded_state(self, batch: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """pi0's state token input, zero-padded to max_state_dim (pi0.5 reads it from the prompt)."""
        return None if self.config.pi05 else pad_last(self._state(batch), self.config.max_state_dim)

    # ---------------------------------------------------------------- training and sampling

    def forward(
        self,
        batch: dict[str, torch.Tensor],
        noise: torch.Tensor | None = None,
        time: torch.Tensor | None = None,
        reduction: str = "mean",
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(LeRobot's loss, metrics): the mean (per sample with reduction="none") of the element-wise
        losses on the first action_dim columns, over every chunk step."""
        actions = pad_last(batch[ACTION_KEY], self.config.max_action_dim)
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

    @torch.no_grad()
    def sample_actions(
        self, batch: dict[str, torch.Tensor], noise: torch.Tensor | None = None
    ) -> torch.Tensor:
        """A normalized action chunk (B, chunk_size, action_dim) from noise (B, chunk_size, max_action_dim)."""
        prefix = self.prefix(batch)
        if noise is None:
            shape = (prefix[0].shape[0], self.config.chunk_size, self.config.max_action_dim)
            noise = sample_noise(shape, prefix[0].device)
        return self.model.sample(prefix, self.padded_state(batch), noise)[:, :, : self.features.action_dim]
