"""The SmolVLM backbone and the action expert as `transformers` builds them, and the task tokenizer.

`--policy.vlm_model_name` is resolved as LeRobot resolves it (policies/common/vla/hub.py). The VLM is built from its
config (random init); `load_vlm_weights` copies the backbone's pretrained weights in later
(`load_pretrained_parts`), so loading a checkpoint never reads them. The expert is a Llama model of the
VLM's text config made `expert_width_multiplier` times narrower, with LeRobot's intermediate size; in
cross-attention layers its k/v projections read the VLM's keys and values. Module and parameter names
are LeRobot's (`vlm.model.text_model.layers.{i}`, `lm_expert.layers.{i}`), so its weights load as they are.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from trainer.errors import ConfigError
from trainer.policies.common import vocab_parallel
from trainer.policies.common.vla.hub import (
    TOKENIZER_FILES,
    import_transformers,
    load_pretrained,
    resolve_pretrained,
)

if TYPE_CHECKING:
    from trainer.policies.smolvla.config import SmolVLAConfig


FLAG = "--policy.vlm_model_name"


def _transformers() -> Any:
    return import_transformers("smolvla", "smolvla")


def vlm_config(config: SmolVLAConfig) -> Any:
    """The backbone's transformers config (SmolVLMConfig), read from its directory."""
    return _load(config, "config", ("config.json",), _transformers().AutoConfig)


def load_tokenizer(config: SmolVLAConfig) -> Any:
    """The backbone's tokenizer; a backbone directory without one is refused in one line."""
    return _load(config, "tokenizer", TOKENIZER_FILES, _transformers().AutoTokenizer)


def _load(config: SmolVLAConfig, what: str, files: tuple[str, ...], auto: Any) -> Any:
    needs = (
        "SmolVLA builds the VLM from the backbone's config and tokenizes the task with its tokenizer: "
        "give a SmolVLM model directory"
    )
    return load_pretrained(config.vlm_model_name, FLAG, what, files, auto, needs)


def expert_intermediate_size(hidden: int, multiplier: int = 4, multiple_of: int = 256) -> int:
    """LeRobot's feed-forward width of the expert: 2/3 of 4x the width, rounded up to 256."""
    size = int(multiplier * int(2 * hidden / 3))
    return multiple_of * ((size + multiple_of - 1) // multiple_of)


class VLMWithExpert(nn.Module):
    """The two stacks SmolVLA runs side by side: `vlm` (SmolVLMForConditionalGeneration, its text
    layers cut to `num_vlm_layers`) and `lm_expert` (a Llama model without token embeddings)."""

    def __init__(self, config: SmolVLAConfig, backbone: Any) -> None:
        super().__init__()
        transformers = _transformers()
        self.vlm = transformers.SmolVLMForConditionalGeneration(backbone)
        text = self.vlm.model.text_model
        if config.num_vlm_layers > 0:
            text.layers = text.layers[: config.num_vlm_layers]
        self.num_vlm_layers = len(text.layers)
        text_config = backbone.text_config
        expert_config = copy.deepcopy(text_config)
        expert_config.hidden_size = int(text_config.hidden_size * config.expert_width_multiplier)
        expert_config.intermediate_size = expert_intermediate_size(expert_config.hidden_size)
        expert_config.num_hidden_layers = self.num_vlm_layers
        if config.num_expert_layers > 0:
            if self.num_vlm_layers % config.num_expert_layers:
                raise ConfigError(
                    f"--policy.num_expert_layers={config.num_expert_layers} must divide the {self.num_vlm_layers} VLM layers kept"
                )
            expert_config.num_hidden_layers = config.num_expert_layers
        self.lm_expert = transformers.AutoModel.from_config(expert_config)
        self.head_dim: int = text_config.head_dim
        self.heads: int = text_config.num_attention_heads
        self.kv_heads: int = text_config.num_key_value_heads
        self.expert_hidden: int = expert_config.hidden_size
        self.cross = "cross" in config.attention_mode
        self.self_attn_every = config.self_attn_every_n_layers
        replaced: list[nn.Module] = []
        if self.cross:
            kv_in = text_config.num_key_value_heads * text_config.head_dim
            kv_out = expert_config.num_key_value_heads * expert_config.head_dim
            for i, layer in enumerate(self.lm_expert.layers):
                if not self.is_self_attention(i):
                    bias = expert_config.attention_bias
                    layer.self_attn.k_proj = nn.Linear(kv_in, kv_out, bias=bias)
                    layer.self_attn.v_proj = nn.Linear(kv_in, kv_out, bias=bias)
                    replaced += [layer.self_attn.k_proj, layer.self_attn.v_proj]
        self.lm_expert.embed_tokens = None
        self._torch_initialized = replaced  # not registered: they are in the tree already
        self.freeze_vision_encoder = config.freeze_vision_encoder
        self.train_expert_only = config.train_expert_only
        self._set_requires_grad()

    def initializer_of(self, module: nn.Module) -> Callable[[nn.Module], None] | None:
        """How a fresh SmolVLA initializes `module`'s own tensors, as LeRobot's does: with transformers'
        `_init_weights` of the model that built it (normal(0, initializer_range), RMSNorm weights one,
        RoPE tables computed); None for a module of ours, torch's `reset_parameters()` (the
        cross-attention projections that replaced the expert's, the projections of flow.py)."""
        if any(module is ours for ours in self._torch_initialized):
            return None
        owner = next((o for o in (self.vlm, self.lm_expert) if any(module is m for m in o.modules())), None)
        return None if owner is None else owner._init_weights

    def is_self_attention(self, layer: int) -> bool:
        """Whether layer `layer` attends jointly over [prefix; actions] (else the expert cross-attends)."""
        return not self.cross or (self.self_attn_every > 0 and layer % self.self_attn_every == 0)

    def expert_layer(self, layer: int) -> nn.Module | None:
        """The expert layer paired with VLM layer `layer` (None where a shallower expert skips it)."""
        every = self.num_vlm_layers // len(self.lm_expert.layers)
        if every > 0 and layer > 0 and layer % every != 0:
            return None
        return self.lm_expert.layers[layer // every if every > 0 else layer]

    def _set_requires_grad(self) -> None:
        """LeRobot's freezing: the vision tower, or the whole VLM; else its parts that cannot reach the
        loss (lm_head, the final norm, the last layer(s)), so DDP sees no unused trainable parameter."""
        model = self.vlm.model
        if self.freeze_vision_encoder:
            model.vision_model.requires_grad_(False)
        if self.train_expert_only:
            self.vlm.requires_grad_(False)
            return
        last = [self.num_vlm_layers - 1]
        experts = len(self.lm_expert.layers)
        if self.num_vlm_layers != experts and self.num_vlm_layers % experts == 0:
            last.append(self.num_vlm_layers - 2)
        self.vlm.lm_head.requires_grad_(False)
        model.text_model.norm.requires_grad_(False)
        for i in last:
            model.text_model.layers[i].requires_grad_(False)

    def train(self, mode: bool = True) -> VLMWithExpert:
        """Frozen parts stay in eval mode, as LeRobot keeps them."""
        super().train(mode)
        if self.freeze_vision_encoder:
            self.vlm.model.vision_model.eval()
        if self.train_expert_only:
            self.vlm.eval()
        return self

    def embed_image(self, image: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) in [-1, 1] -> (B, tokens, text hidden): vision tower, then the connector."""
        model = self.vlm.model
        vision = model.vision_model
        hidden = vision(
            pixel_values=image.to(vision.embeddings.patch_embedding.weight.dtype)
        ).last_hidden_state
        return model.connector(hidden)

    def embed_language(self, tokens: torch.Tensor) -> torch.Tensor:
        """The tokens' rows of the VLM's table. Sharded by FSDP2 (a unit of its own), the table is read on
        each rank's rows, never gathered (vocab_parallel.py)."""
        return vocab_parallel.embed(self.vlm.model.text_model.embed_tokens, tokens)

    def load_backbone_weights(self, name: str) -> None:
        """Copy the backbone's pretrained weights (safetensors in its directory) into `vlm`."""
        from ckpt_tools import load_model_state_dict

        directory = resolve_pretrained(name, FLAG, weights=True)
        try:
            state = load_model_state_dict(directory)
        except Exception as exc:
            raise ConfigError(
                f"{FLAG}={name}: --policy.load_vlm_weights=true but its weights do not load ({type(exc).__name__}: {' '.join(str(exc).split())[:160]})"
            ) from None
        own = self.vlm.state_dict()
        missing = [k for k in own if k not in state and not k.startswith("model.text_model.layers.")]
        if missing:
            raise ConfigError(
                f"{FLAG}={name}: its weights lack {missing[0]}; give the SmolVLM model the config describes"
            )
        self.vlm.load_state_dict({k: v for k, v in state.items() if k in own}, strict=False)
