"""pi0's and pi0.5's flow-matching model (LeRobot's `PI0Pytorch` / `PI05Pytorch`): prefix and suffix
tokens, the training loss, and Euler sampling with the prefix's keys and values cached.

The prefix is [each camera's image tokens, the language tokens], one bidirectional block (restricted by
the pad mask). pi0's suffix is [a state token, the action tokens] with blocks `1 1 0 ... 0` (the state
token sees the prefix and itself, the action tokens everything); the action tokens are
`action_time_mlp_out(silu(action_time_mlp_in([action_in_proj(x_t), time_emb])))`. pi0.5's suffix is the
action tokens `action_in_proj(x_t)` alone (blocks `1 0 ... 0`): its state is in the prompt and the time
conditions the expert's norms (adaRMS) through `silu(time_mlp_out(silu(time_mlp_in(time_emb))))`.
Positions are `cumsum(pad) - 1` over [prefix; suffix], so the language padding between the two does
not advance them.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from trainer.policies.common.vla.attention import block_mask
from trainer.policies.common.vla.flow import euler, noisy_actions, time_embedding
from trainer.policies.pi.backbone import PaliGemmaWithExpert
from trainer.policies.pi.config import PI0Config, Sizes
from trainer.policies.pi.layers import KeyValue

# (embeddings, pad mask, block starts) of a token sequence.
Tokens = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class PiFlowModel(nn.Module):
    """Parameter names are LeRobot's below `model.` (weights.py maps the paired layers)."""

    def __init__(self, config: PI0Config, sizes: Sizes) -> None:
        super().__init__()
        self.config = config
        self.paligemma_with_expert = PaliGemmaWithExpert(config, sizes)
        width = sizes.expert.width
        self.action_in_proj = nn.Linear(config.max_action_dim, width)
        self.action_out_proj = nn.Linear(width, config.max_action_dim)
        if config.pi05:
            self.time_mlp_in = nn.Linear(width, width)
            self.time_mlp_out = nn.Linear(width, width)
        else:
            self.state_proj = nn.Linear(config.max_state_dim, width)
            self.action_time_mlp_in = nn.Linear(2 * width, width)
            self.action_time_mlp_out = nn.Linear(width, width)

    def embed_prefix(self, images: list[torch.Tensor], image_masks: list[torch.Tensor], tokens: torch.Tensor,
                     token_masks: torch.Tensor) -> Tokens:  # fmt: skip
        """[camera tokens..., language tokens], all in block 0."""
        embs, pads = [], []
        for image, image_mask in zip(images, image_masks, strict=True):
            emb = self.paligemma_with_expert.embed_image(image)
            embs.append(emb)
            pads.append(image_mask[:, None].expand(emb.shape[0], emb.shape[1]))
        embs.append(self.paligemma_with_expert.embed_language(tokens).to(embs[0].dtype))
        pads.append(token_masks)
        emb, pad = torch.cat(embs, dim=1), torch.cat(pads, dim=1)
        return emb, pad, torch.zeros_like(pad)

    def embed_suffix(
        self, state: torch.Tensor | None, x_t: torch.Tensor, time: torch.Tensor
    ) -> tuple[Tokens, torch.Tensor | None]:
        """The suffix tokens and pi0.5's adaRMS condition (None for pi0)."""
        config = self.config
        action = projected(self.action_in_proj, x_t)
        t = time_embedding(time, action.shape[-1], config.min_period, config.max_period).to(time.dtype)
        b, n = action.shape[:2]
        if config.pi05:
            cond = F.silu(self.time_mlp_out(F.silu(projected(self.time_mlp_in, t))))
            blocks = [1] + [0] * (n - 1)
            emb = action
        else:
            assert state is not None, "pi0 reads the state"
            t = t[:, None, :].expand_as(action)
            action = self.action_time_mlp_out(
                F.silu(projected(self.action_time_mlp_in, torch.cat([action, t], dim=2)))
            )
            emb = torch.cat([projected(self.state_proj, state)[:, None, :], action], dim=1)
            blocks, cond = [1, 1] + [0] * (n - 1), None
        pad = torch.ones(b, emb.shape[1], dtype=torch.bool, device=emb.device)
        block = torch.tensor(blocks, dtype=torch.bool, device=emb.device)[None].expand(b, -1)
        return (emb, pad, block), cond

    def velocity(self, expert_out: torch.Tensor) -> torch.Tensor:
        """action_out_proj of the action tokens, in float32 as LeRobot computes it (in the weight's
        dtype under an FSDP2 mixed precision policy, the velocity then brought back to float32)."""
        return projected(self.action_out_proj, expert_out[:, -self.config.chunk_size :]).float()

    def losses(self, prefix: Tokens, state: torch.Tensor | None, actions: torch.Tensor, noise: torch.Tensor,
               time: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """Element-wise squared velocity error (B, chunk, max_action_dim) at noise `noise`, time `time`:
        the prefix's keys and values, then the suffix against them (LeRobot's one pass over [prefix;
        suffix], whose prefix rows never see the suffix, in two: layers.py says why)."""
        x_t, u_t = noisy_actions(actions, noise, time)
        out = self.denoise(prefix, self.prefill(prefix), state, x_t, time)
        return F.mse_loss(u_t, self.velocity(out), reduction="none")

    def prefill(self, prefix: Tokens) -> list[KeyValue]:
        """The prefix's keys (after RoPE) and values at every layer: once per chunk when sampling."""
        emb, pad, block = prefix
        return self.paligemma_with_expert.prefill(emb, *prefix_layout(pad, block))

    def denoise(
        self,
        prefix: Tokens,
        cache: list[KeyValue],
        state: torch.Tensor | None,
        x_t: torch.Tensor,
        time: torch.Tensor,
    ) -> torch.Tensor:
        """The expert's normed output (B, suffix, width) for x_t at `time` against the cached prefix."""
        (suffix, suffix_pad, suffix_block), cond = self.embed_suffix(state, x_t, time)
        mask, positions = suffix_layout(prefix[1], suffix_pad, suffix_block)
        return self.paligemma_with_expert.expert(suffix, cache, mask, positions, cond)

    def sample(self, prefix: Tokens, state: torch.Tensor | None, noise: torch.Tensor) -> torch.Tensor:
        """x_0 (B, chunk, max_action_dim) integrated from x_1 = `noise` in num_inference_steps steps."""
        cache = self.prefill(prefix)

        def velocity(x_t: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
            return self.velocity(self.denoise(prefix, cache, state, x_t, time))

        return euler(velocity, noise, self.config.num_inference_steps)


def projected(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """`linear(x)`, x cast to the weight's dtype: float32, as LeRobot keeps the action and time
    projections and feeds them, or the compute dtype of an FSDP2 mixed precision policy
    (`--accelerator.fsdp.mixed_precision_policy.param_dtype`: inside the root unit's forward the weight
    is its gathered copy in that dtype, and the float32 noised actions and time embedding must follow)."""
    return cast(torch.Tensor, linear(x.to(linear.weight.dtype)))


def prefix_layout(pad: torch.Tensor, block: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mask (B, L, L), positions (B, L)) of the prefix's pass: LeRobot's make_att_2d_masks and
    `cumsum(pad) - 1`."""
    return block_mask(pad, block), torch.cumsum(pad, dim=1) - 1


def suffix_layout(
    prefix_pad: torch.Tensor, suffix_pad: torch.Tensor, suffix_block: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(mask (B, suffix, prefix + suffix), positions (B, suffix)) of the suffix's pass (training and
    each denoising step): the suffix sees the valid prefix and its own blocks; its positions continue
    after the valid prefix tokens."""
    n = suffix_pad.shape[1]
    mask = torch.cat([prefix_pad[:, None, :].expand(-1, n, -1), block_mask(suffix_pad, suffix_block)], dim=2)
    return mask, prefix_pad.sum(dim=-1)[:, None] + torch.cumsum(suffix_pad, dim=1) - 1
