"""SmolVLA's flow-matching model (LeRobot's `VLAFlowMatching`): the prefix, the action tokens, the
loss, and Euler sampling.

The prefix is [each camera's image tokens, the task's tokens, one state token], all scaled as LeRobot
scales them; its attention blocks are `0 ... 0 1` (the state starts a block) and every action token
starts its own block, so the action tokens are causal among themselves. Positions are
`cumsum(pad_mask) - 1`. Training interpolates `x_t = t * noise + (1 - t) * actions` and regresses the
velocity `noise - actions`; sampling integrates from t = 1 to 0 in `num_steps` Euler steps with the
prefix's keys and values computed once.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainer.policies.common.vla.attention import block_mask
from trainer.policies.common.vla.flow import euler, noisy_actions, time_embedding
from trainer.policies.smolvla.backbone import VLMWithExpert
from trainer.policies.smolvla.config import SmolVLAConfig
from trainer.policies.smolvla.joint import JointStack


class FlowMatching(nn.Module):
    def __init__(self, config: SmolVLAConfig, backbone: Any, image_tokens: tuple[int, int] | None) -> None:
        super().__init__()
        self.config = config
        self.vlm_with_expert = VLMWithExpert(config, backbone)
        hidden, expert = backbone.text_config.hidden_size, self.vlm_with_expert.expert_hidden
        self.state_proj = nn.Linear(config.max_state_dim, hidden)
        self.action_in_proj = nn.Linear(config.max_action_dim, expert)
        self.action_out_proj = nn.Linear(expert, config.max_action_dim)
        self.action_time_mlp_in = nn.Linear(2 * expert, expert)
        self.action_time_mlp_out = nn.Linear(expert, expert)
        self.state_proj.requires_grad_(config.train_state_proj)
        # (fake image token, global image token) ids, for add_image_special_tokens
        self.image_tokens = image_tokens
        self.stack = JointStack(self.vlm_with_expert)

    def embed_prefix(
        self, images: list[torch.Tensor], image_masks: list[torch.Tensor], tokens: torch.Tensor,
        token_masks: torch.Tensor, state: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        """(embeddings, pad mask, block starts) of [cameras, task, state]."""
        vlm = self.vlm_with_expert
        embs, pads, blocks = [], [], []
        b = state.shape[0]

        def add(emb: torch.Tensor, pad: torch.Tensor, block: int = 0) -> None:
            embs.append(emb)
            pads.append(pad)
            blocks.extend([block] * emb.shape[1])

        for image, image_mask in zip(images, image_masks, strict=True):
            if self.config.add_image_special_tokens:
                add(*self._special(self.image_tokens, b, state.device))
            emb = vlm.embed_image(image)
            emb = emb * torch.tensor(emb.shape[-1] ** 0.5, dtype=emb.dtype, device=emb.device)
            add(emb, image_mask[:, None].expand(b, emb.shape[1]))
            if self.config.add_image_special_tokens and self.image_tokens is not None:
                add(*self._special(self.image_tokens[:1], b, state.device))
        lang = vlm.embed_language(tokens)
        add(lang * math.sqrt(lang.shape[-1]), token_masks)
        state_emb = self.state_proj(state)[:, None, :]
        add(state_emb, torch.ones(b, 1, dtype=torch.bool, device=state.device), block=1)
        emb, pad = torch.cat(embs, dim=1), torch.cat(pads, dim=1)
        block = torch.tensor(blocks, dtype=torch.bool, device=pad.device)[None]
        if pad.shape[1] < self.config.prefix_length:
            extra = self.config.prefix_length - pad.shape[1]
            emb = F.pad(emb, (0, 0, 0, extra))
            pad, block = F.pad(pad, (0, extra)), F.pad(block, (0, extra))
        return emb, pad, block.expand(b, -1)

    def _special(
        self, ids: tuple[int, ...] | None, b: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if ids is None:
            raise ValueError("add_image_special_tokens needs the tokenizer's image token ids")
        emb = self.vlm_with_expert.embed_language(torch.tensor(ids, device=device))[None].expand(b, -1, -1)
        return emb, torch.ones(b, len(ids), dtype=torch.bool, device=device)

    def embed_suffix(self, x_t: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
        """The action tokens: action_in_proj(x_t) beside the time's embedding, through the time MLP."""
        action = self.action_in_proj(x_t)
        t = time_embedding(time, action.shape[-1], self.config.min_period, self.config.max_period)
        t = t.to(action.dtype)[:, None, :].expand_as(action)
        return self.action_time_mlp_out(F.silu(self.action_time_mlp_in(torch.cat([action, t], dim=2))))

    def velocity(self, expert_out: torch.Tensor) -> torch.Tensor:
        """action_out_proj of the action tokens, in float32 as LeRobot computes it (in the policy's
        dtype when --policy.dtype casts it)."""
        out = expert_out[:, -self.config.chunk_size :].float()
        return self.action_out_proj(out.to(self.action_out_proj.weight.dtype))

    def losses(
        self, prefix: tuple[torch.Tensor, torch.Tensor, torch.Tensor], actions: torch.Tensor,
        noise: torch.Tensor, time: torch.Tensor,
    ) -> torch.Tensor:  # fmt: skip
        """Element-wise squared error (B, chunk, max_action_dim) of the predicted velocity."""
        x_t, target = noisy_actions(actions, noise, time)
        emb, pad, block = prefix
        suffix = self.embed_suffix(x_t, time)
        b, n = suffix.shape[:2]
        ones = torch.ones(b, n, dtype=torch.bool, device=pad.device)
        pads, blocks = torch.cat([pad, ones], dim=1), torch.cat([block, ones], dim=1)
        positions = torch.cumsum(pads, dim=1) - 1
        out, _ = self.stack.run(emb, suffix, block_mask(pads, blocks), positions)
        assert out is not None
        return F.mse_loss(target, self.velocity(out), reduction="none")

    def sample(
        self, prefix: tuple[torch.Tensor, torch.Tensor, torch.Tensor], noise: torch.Tensor
    ) -> torch.Tensor:
        """Euler integration of the velocity from t = 1 (noise) to t = 0 (B, chunk, max_action_dim)."""
        emb, pad, block = prefix
        positions = torch.cumsum(pad, dim=1) - 1
        _, cache = self.stack.run(emb, None, block_mask(pad, block), positions, fill=True)
        b, n = noise.shape[:2]
        ones = torch.ones(b, n, dtype=torch.bool, device=pad.device)
        mask = torch.cat([pad[:, None, :].expand(b, n, -1), block_mask(ones, ones)], dim=2)
        positions = pad.sum(dim=-1)[:, None] + torch.cumsum(ones, dim=1) - 1

        def velocity(x_t: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
            out, _ = self.stack.run(None, self.embed_suffix(x_t, time), mask, positions, cache=cache)
            assert out is not None
            return self.velocity(out)

        return euler(velocity, noise, self.config.num_steps)
