"""PaliGemma (SigLIP, the multi-modal projector, Gemma) and the Gemma action expert, built from
transformers' classes at the sizes the config resolves (LeRobot's `PaliGemmaWithExpertModel`).

Weights are initialised from the configs (random); every weight a run uses comes from a checkpoint.
The module names are LeRobot's except the decoder layers, which pair up in `layers.{i}` (`.paligemma`
and `.expert`, each an FSDP unit: layers.py); weights.py maps the names both ways. What LeRobot holds
but nothing reads is not built: both `lm_head`s, the expert's token embedding. PaliGemma's final norm is kept (it is in every
checkpoint) but frozen, as are the parts of the last PaliGemma layer that only the discarded prefix
output reads, so no trainable parameter is left without a gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
from torch import nn

from trainer.policies.common import vocab_parallel
from trainer.policies.common.checkpointing import checkpointed
from trainer.policies.common.vla.hub import import_transformers
from trainer.policies.pi.config import GemmaSize, PI0Config, Sizes
from trainer.policies.pi.layers import IdleRMSNorm, JointLayer, KeyValue, PiRMSNorm

# What LeRobot keeps in float32 when --policy.dtype=bfloat16 casts the rest.
FLOAT32_PARTS = (
    "vision_tower",
    "multi_modal_projector",
    "input_layernorm",
    "post_attention_layernorm",
    "model.norm",
)
# What LeRobot's gradient_checkpointing recomputes in the backward pass (each layer of either model).
CHECKPOINTED = ("SiglipEncoderLayer", "DecoderLayer")


def gemma_config(size: GemmaSize, vocab_size: int) -> Any:
    """transformers' GemmaConfig for one stack, with LeRobot's activation and default RoPE/eps."""
    transformers = import_transformers("pi0", "pi")
    return transformers.GemmaConfig(
        hidden_size=size.width, num_hidden_layers=size.depth, intermediate_size=size.mlp_dim,
        num_attention_heads=size.num_heads, num_key_value_heads=size.num_kv_heads, head_dim=size.head_dim,
        vocab_size=vocab_size, hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh",
    )  # fmt: skip


def _siglip(transformers: Any, vision_config: Any) -> nn.Module:
    """SigLIP's vision transformer (embeddings, encoder, post-layernorm): the `vision_model` inside
    transformers' SiglipVisionModel up to 5.x's flattening, the model itself after it."""
    model = transformers.SiglipVisionModel(vision_config)
    return getattr(model, "vision_model", model)


class Projector(nn.Module):
    """PaliGemma's multi-modal projector: one linear map from SigLIP's width to Gemma's."""

    def __init__(self, vision_width: int, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(vision_width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


class PaliGemmaWithExpert(nn.Module):
    """`paligemma.model.{vision_tower, multi_modal_projector, language_model.{embed_tokens, norm}}`,
    `gemma_expert.model.norm`, and the paired decoder layers `layers.{i}`."""

    def __init__(self, config: PI0Config, sizes: Sizes) -> None:
        super().__init__()
        transformers = import_transformers("pi0", "pi")
        from transformers.models.gemma.modeling_gemma import (
            GemmaRotaryEmbedding,
            GemmaTextScaledWordEmbedding,
        )

        v = sizes.vision
        vision_config = transformers.SiglipVisionConfig(
            hidden_size=v.hidden_size, intermediate_size=v.intermediate_size, num_hidden_layers=v.num_hidden_layers,
            num_attention_heads=v.num_attention_heads, patch_size=v.patch_size, image_size=config.image_resolution[0],
            hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6, vision_use_head=False,
        )  # fmt: skip
        vlm, expert = gemma_config(sizes.vlm, sizes.vocab_size), gemma_config(sizes.expert, sizes.vocab_size)
        language = nn.ModuleDict(
            {
                "embed_tokens": GemmaTextScaledWordEmbedding(
                    sizes.vocab_size, sizes.vlm.width, 0, embed_scale=sizes.vlm.width**0.5
                ),
                "norm": IdleRMSNorm(sizes.vlm.width, vlm.rms_norm_eps),
            }
        )
        self.paligemma = nn.ModuleDict(
            {
                "model": nn.ModuleDict(
                    {
                        "vision_tower": nn.ModuleDict({"vision_model": _siglip(transformers, vision_config)}),
                        "multi_modal_projector": Projector(v.hidden_size, sizes.vlm.width),
                        "language_model": language,
                    }
                )
            }
        )
        cond = sizes.expert.width if config.pi05 else None
        self.gemma_expert = nn.ModuleDict(
            {"model": nn.ModuleDict({"norm": PiRMSNorm(sizes.expert.width, expert.rms_norm_eps, cond)})}
        )
        depth = sizes.vlm.depth
        self.layers = nn.ModuleList(
            JointLayer(vlm, expert, i, last=i == depth - 1, adarms=config.pi05) for i in range(depth)
        )
        self.rotary_emb = GemmaRotaryEmbedding(vlm)
        self.freeze_vision_encoder = config.freeze_vision_encoder
        self.train_expert_only = config.train_expert_only
        self._initializers = self._transformers_initializers(transformers, vision_config, vlm, expert)
        if config.dtype == "bfloat16":
            self._to_bfloat16()
        self._set_requires_grad()
        if config.gradient_checkpointing:  # LeRobot's: every SigLIP layer and decoder layer recomputed
            for module in self.modules():
                if type(module).__name__ in CHECKPOINTED:
                    module.forward = checkpointed(module.forward)

    def _transformers_initializers(
        self, transformers: Any, vision_config: Any, vlm: Any, expert: Any
    ) -> dict[int, Callable[[nn.Module], None]]:
        """The modules transformers built (by id) -> the `_init_weights` of the model class LeRobot
        builds them in: SigLIP's for the vision tower, Gemma's for the decoder layers' attention and MLP,
        the token embedding (its sqrt(width) scale), the RoPE tables and the projector."""
        siglip = transformers.SiglipPreTrainedModel(vision_config)._init_weights
        gemma = {"paligemma": transformers.GemmaPreTrainedModel(vlm)._init_weights}
        gemma["expert"] = transformers.GemmaPreTrainedModel(expert)._init_weights
        owned: dict[int, Callable[[nn.Module], None]] = {id(m): siglip for m in self.vision_tower.modules()}
        for layer in self.joint_layers:
            for decoder, stream in ((layer.paligemma, "paligemma"), (layer.expert, "expert")):
                for part in (decoder.self_attn, decoder.mlp):
                    owned.update({id(m): gemma[stream] for m in part.modules()})
        for name in ("language_model.embed_tokens", "multi_modal_projector"):
            owned.update(
                {id(m): gemma["paligemma"] for m in self.get_submodule(f"paligemma.model.{name}").modules()}
            )
        owned.update({id(m): gemma["paligemma"] for m in self.rotary_emb.modules()})
        return owned

    def initializer_of(self, module: nn.Module) -> Callable[[nn.Module], None] | None:
        """How a fresh pi0 initializes `module`'s own tensors, as LeRobot's does: transformers'
        initializer for the modules transformers built (normal(0, 0.02) for Gemma's, SigLIP's own
        scheme, the computed buffers: RoPE tables, the embedding scale, SigLIP's position ids); None for
        ours (the norms: zero weights; the action projections: torch's)."""
        return self._initializers.get(id(module))

    @property
    def vision_tower(self) -> nn.Module:
        return self.get_submodule("paligemma.model.vision_tower")

    @property
    def joint_layers(self) -> list[JointLayer]:
        return [cast(JointLayer, layer) for layer in self.layers]

    def _to_bfloat16(self) -> None:
        """LeRobot's bfloat16: everything but the vision path and the norms."""
        self.to(torch.bfloat16)
        for name, param in self.named_parameters():
            if any(part in name for part in FLOAT32_PARTS):
                param.data = param.data.float()

    def _set_requires_grad(self) -> None:
        """LeRobot's freezing, plus the parts no output reads (the module docstring)."""
        if self.freeze_vision_encoder:
            self.vision_tower.requires_grad_(False)
        if self.train_expert_only:
            self.paligemma.requires_grad_(False)
            for layer in self.joint_layers:
                layer.paligemma.requires_grad_(False)
        self.get_submodule("paligemma.model.language_model.norm").requires_grad_(False)
        last = self.joint_layers[-1].paligemma
        for part in (last.self_attn.q_proj, last.self_attn.o_proj, last.post_attention_layernorm, last.mlp):
            part.requires_grad_(False)

    def train(self, mode: bool = True) -> PaliGemmaWithExpert:
        """Frozen parts stay in eval mode, as LeRobot keeps them."""
        super().train(mode)
        if self.freeze_vision_encoder:
            self.vision_tower.eval()
        if self.train_expert_only:
            self.paligemma.eval()
            for layer in self.joint_layers:
                layer.paligemma.eval()
        return self

    def embed_image(self, image: torch.Tensor) -> torch.Tensor:
        """(B, 3, R, R) in [-1, 1] -> (B, (R/patch)^2, width): SigLIP's last hidden state (after its
        post-layernorm) through the projector, unscaled, in float32."""
        vision = self.get_submodule("paligemma.model.vision_tower.vision_model")
        hidden = vision(pixel_values=image.float()).last_hidden_state
        return self.get_submodule("paligemma.model.multi_modal_projector")(hidden)

    def embed_language(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token embeddings times sqrt(width) (GemmaTextScaledWordEmbedding, in the weight dtype). Sharded
        by FSDP2 (its own unit), the table is read on each rank's rows, never gathered (vocab_parallel.py)."""
        embed = cast(nn.Embedding, self.get_submodule("paligemma.model.language_model.embed_tokens"))
        return vocab_parallel.embed(embed, tokens, scale=embed.get_buffer("embed_scale"))

    def prefill(self, prefix: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor) -> list[KeyValue]:
        """The prefix's keys (after RoPE) and values at every layer: the prefix through PaliGemma's
        layers. `mask` (B, L, L) and `positions` (B, L) cover its L tokens."""
        hidden: torch.Tensor | None = prefix.to(self._dtype)
        cos, sin = self._rope(positions)
        cache = []
        for layer in self.joint_layers:
            assert hidden is not None, "only the last PaliGemma layer is idle"
            hidden, kv = layer.paligemma(hidden, mask, cos, sin)
            cache.append(kv)
        return cache

    def expert(
        self,
        suffix: torch.Tensor,
        cache: list[KeyValue],
        mask: torch.Tensor,
        positions: torch.Tensor,
        cond: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The expert's normed output for the suffix: through the expert's layers, each attending to
        its layer's prefix keys and values in `cache` and to its own. `mask` (B, L, prefix + L) and
        `positions` (B, L) cover the suffix's L tokens."""
        hidden = suffix.to(self._dtype)
        cos, sin = self._rope(positions)
        for layer, past in zip(self.joint_layers, cache, strict=True):
            out, _ = layer.expert(hidden, mask, cos, sin, cond, past)
            assert out is not None, "the expert's layers are never idle"
            hidden = out
        normed, _ = self.get_submodule("gemma_expert.model.norm")(hidden, cond)
        return cast(torch.Tensor, normed)

    @property
    def _dtype(self) -> torch.dtype:
        """The decoder layers' dtype (bfloat16 under LeRobot's `dtype=bfloat16`), which their inputs take."""
        return self.joint_layers[0].paligemma.self_attn.q_proj.weight.dtype

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE's (cos, sin) (B, L, head_dim) at `positions` (B, L), in the layers' dtype."""
        empty = torch.empty(0, dtype=self._dtype, device=positions.device)
        cos, sin = self.rotary_emb(empty, positions)
        return cos, sin
