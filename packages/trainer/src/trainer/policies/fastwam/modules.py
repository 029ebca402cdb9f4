"""FastWAM's trainable modules in plain torch, under LeRobot 0.6.1's tensor names.

`MoT` holds `mixtures.video` (the Wan2.2 video DiT's embeddings and head), `mixtures.action` (the action
DiT's) and `layers.{i}.blocks.{video,action}` (layer i of each expert): a `MoTLayer` owns both blocks
because their joint attention reads both at once, so it is the one FSDP unit that gathers them. Every
module whose weights are read runs its own `forward()` (`VideoExpert`, `ActionExpert`, `VideoHead`,
`ActionHead`, `MoTLayer`, and each large Linear, a `Projection`): those are the units FSDP's hooks see.

A fresh build starts as LeRobot's does: the video expert's weights as Wan's `init_weights` leaves them
(every Linear Xavier-uniform with a zero bias, the text and time embeddings normal(0, 0.02), the patch
embedding Xavier-uniform over its flattened kernel, the head's Linear zero), the action expert and the
proprio encoder with torch's own initializers (LeRobot's `ActionDiT` has no `init_weights`), every
block's and head's modulation normal(0, 1 / hidden). Each module does it in its `reset_parameters()`,
which the engine's meta build calls too.

Numerics follow LeRobot's (the fixture's README lists them): the timestep sinusoid in float64
(`[cos, sin]`), RoPE in complex128, layer norms and the q/k RMSNorms (over the whole attention width) in
float32, attention in float32 under `fp32_attention`; video tokens modulated per token (latent frame 0
at timestep 0), action tokens per sample.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import NamedTuple, cast

import torch
from torch import nn
from torch.nn import functional

from trainer.policies.fastwam.config import ActionSize, VideoSize


def sinusoid(dim: int, position: torch.Tensor) -> torch.Tensor:
    """Wan's timestep embedding: `[cos, sin]` of position x 10000^(-i / half), in float64."""
    half = dim // 2
    position = position.to(torch.float64)
    angles = torch.outer(
        position, torch.pow(10000, -torch.arange(half, device=position.device).to(position).div(half))
    )
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=1)


@functools.cache
def rope_table(dim: int, length: int = 1024) -> torch.Tensor:
    """(length, dim / 2) complex128 rotations, theta 10000 (Wan's `rope_params`), always on the CPU."""
    exponents = torch.arange(0, dim, 2, device="cpu").to(torch.float64).div(dim)
    angles = torch.outer(torch.arange(length, device="cpu"), 1.0 / torch.pow(10000, exponents))
    return torch.polar(torch.ones_like(angles), angles)


def video_rope(head_dim: int, grid: tuple[int, int, int], device: torch.device) -> torch.Tensor:
    """(f*h*w, 1, head_dim / 2) rotations of the video tokens: the head split over frame, row and column
    as `d - 4(d//6)`, `2(d//6)`, `2(d//6)` (each axis its own table)."""
    third = head_dim // 6
    sizes = (head_dim - 4 * third, 2 * third, 2 * third)
    f, h, w = grid
    tables = [rope_table(size)[:n] for size, n in zip(sizes, grid, strict=True)]
    rotations = torch.cat(
        [
            tables[0].view(f, 1, 1, -1).expand(f, h, w, -1),
            tables[1].view(1, h, 1, -1).expand(f, h, w, -1),
            tables[2].view(1, 1, w, -1).expand(f, h, w, -1),
        ],
        dim=-1,
    )
    return rotations.reshape(f * h * w, 1, -1).to(device)


def rotate(x: torch.Tensor, rotations: torch.Tensor, num_heads: int, precision: torch.dtype) -> torch.Tensor:
    """(B, S, heads x head_dim) rotated by `rotations` (S, 1, head_dim / 2), consecutive pairs as complex
    numbers, multiplied in `precision` (video: float64, then float32; action: float32, back to x's dtype
    as LeRobot does)."""
    b, s, _ = x.shape
    pairs = torch.view_as_complex(x.to(precision).reshape(b, s, num_heads, -1, 2))
    rotated = torch.view_as_real(pairs * rotations).flatten(2)
    return rotated.float() if precision == torch.float64 else rotated.to(x.dtype)


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_heads: int, mask: torch.Tensor | None, fp32: bool
) -> torch.Tensor:
    """Scaled dot-product attention over (B, S, heads x head_dim) inputs with a boolean mask."""
    q, k, v = (t.unflatten(2, (num_heads, -1)).transpose(1, 2) for t in (q, k, v))
    if fp32:
        q, k, v = q.float(), k.float(), v.float()
    else:
        q, k = q.to(v.dtype), k.to(v.dtype)
    out = functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return out.transpose(1, 2).flatten(2)


class RMSNorm(nn.Module):
    """Wan's RMSNorm: normalized in float32, scaled in the weight's dtype."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class LayerNorm(nn.LayerNorm):
    """Wan's LayerNorm: computed in float32 whatever the weights' dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = None if self.weight is None else self.weight.float()
        bias = None if self.bias is None else self.bias.float()
        return functional.layer_norm(x.float(), self.normalized_shape, weight, bias, self.eps).to(x.dtype)


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale) + shift


XAVIER = None  # `wan_init`'s std for Xavier-uniform weights


def wan_init(linear: nn.Linear, std: float | None) -> None:
    """Wan's `init_weights` for a Linear of the video DiT: a zero bias and the weight Xavier-uniform
    (`std` None), normal(0, std), or zero (`std` 0: the head)."""
    with torch.no_grad():
        if std is XAVIER:
            nn.init.xavier_uniform_(linear.weight)
        elif std == 0:
            nn.init.zeros_(linear.weight)
        else:
            nn.init.normal_(linear.weight, std=std)
        if linear.bias is not None:
            nn.init.zeros_(linear.bias)


class WanLinear(nn.Linear):
    """A Linear that starts as LeRobot's does: the video expert's (`wan`) as Wan's `init_weights` leaves
    it (`wan_init` with `std`), the action expert's with torch's own initializer."""

    def __init__(
        self, in_features: int, out_features: int, wan: bool = True, std: float | None = XAVIER
    ) -> None:
        self.wan, self.std = wan, std  # read by reset_parameters(), which nn.Linear's constructor calls
        super().__init__(in_features, out_features)

    def reset_parameters(self) -> None:
        if self.wan:
            wan_init(self, self.std)
        else:
            super().reset_parameters()


class Projection(WanLinear):
    """A large linear layer that is an FSDP unit of its own: a block's projections (an attention's q, k,
    v, o; the FFN's two) inside its MoT layer's unit, and the Linears of each expert's text and time
    embeddings inside its expert's. FSDP2 holds a unit's gathered weights twice while it gathers them,
    so the largest unit sets what a step adds to the peak. At LeRobot's widths a whole MoT layer is
    197 M parameters (the video block's FFN alone 88 M) and the video expert's embeddings 89 M; the
    largest projection is the video time projection's 57 M (3072 x 18432), then the FFN's 44 M (as
    pi's `MLPProjection`)."""


class Projections(nn.Module):
    """An attention's q/k/v/o projections between the expert's width and the joint attention width,
    with q and k RMS-normalized over the whole attention width."""

    def __init__(self, hidden: int, width: int, eps: float, wan: bool) -> None:
        super().__init__()
        self.q, self.k, self.v = (
            Projection(hidden, width, wan),
            Projection(hidden, width, wan),
            Projection(hidden, width, wan),
        )
        self.o = Projection(width, hidden, wan)
        self.norm_q, self.norm_k = RMSNorm(width, eps), RMSNorm(width, eps)


@dataclass
class Modulation:
    """A block's six adaLN terms: before attention (shift, scale, gate), before the FFN (the same)."""

    shift_msa: torch.Tensor
    scale_msa: torch.Tensor
    gate_msa: torch.Tensor
    shift_mlp: torch.Tensor
    scale_mlp: torch.Tensor
    gate_mlp: torch.Tensor


class Block(nn.Module):
    """One expert's transformer block: modulated self-attention (joint with the other expert, run by
    `MoTLayer`), cross-attention to the prompt context, modulated FFN. `wan`: the video expert's (its
    projections start as Wan's)."""

    def __init__(
        self, hidden: int, ffn: int, num_heads: int, head_dim: int, eps: float, fp32: bool, wan: bool
    ) -> None:
        super().__init__()
        width = num_heads * head_dim
        self.num_heads, self.fp32 = num_heads, fp32
        self.norm1 = LayerNorm(hidden, eps, elementwise_affine=False)
        self.self_attn = Projections(hidden, width, eps, wan)
        self.norm3 = LayerNorm(hidden, eps, elementwise_affine=True)
        self.cross_attn = Projections(hidden, width, eps, wan)
        self.norm2 = LayerNorm(hidden, eps, elementwise_affine=False)
        self.ffn = nn.Sequential(
            Projection(hidden, ffn, wan), nn.GELU(approximate="tanh"), Projection(ffn, hidden, wan)
        )
        self.modulation = nn.Parameter(torch.empty(1, 6, hidden))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Wan's initial modulation: N(0, 1 / hidden)."""
        with torch.no_grad():
            self.modulation.normal_(0.0, self.modulation.shape[-1] ** -0.5)

    def modulation_terms(self, t_mod: torch.Tensor) -> Modulation:
        """`modulation + t_mod` split six ways: per token for (B, S, 6, C), per sample for (B, 6, C).
        Each term is a tensor of its own, not a view of one sum: the backward pass keeps the two gates,
        and a view would keep all six (the video stream's per-token sum: 21.7 MB per layer at LeRobot's
        size and batch 2, where a layer keeps 74 MB in all)."""
        per_token = t_mod.ndim == 4
        modulation = self.modulation.to(t_mod.dtype)
        if per_token:
            return Modulation(*(modulation[:, i] + t_mod[:, :, i] for i in range(6)))
        return Modulation(*(modulation[:, i : i + 1] + t_mod[:, i : i + 1] for i in range(6)))

    def qkv(
        self, x: torch.Tensor, mod: Modulation, rotations: torch.Tensor, precision: torch.dtype, queries: bool
    ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """This block's rotated queries (None unless `queries`) and keys and its values for the joint
        attention."""
        attn = self.self_attn
        h = modulate(self.norm1(x), mod.shift_msa, mod.scale_msa)
        q = rotate(attn.norm_q(attn.q(h)), rotations, self.num_heads, precision) if queries else None
        k = rotate(attn.norm_k(attn.k(h)), rotations, self.num_heads, precision)
        return q, k, attn.v(h)

    def finish(
        self,
        x: torch.Tensor,
        mixed: torch.Tensor,
        mod: Modulation,
        context: torch.Tensor,
        context_mask: torch.Tensor,
    ) -> torch.Tensor:
        """The rest of the block after the joint attention's output `mixed`."""
        o = self.self_attn.o
        x = x + mod.gate_msa * o(mixed.to(o.weight.dtype))
        x = x + self.cross(self.norm3(x), context, context_mask)
        return x + mod.gate_mlp * self.ffn(modulate(self.norm2(x), mod.shift_mlp, mod.scale_mlp))

    def cross(self, x: torch.Tensor, context: torch.Tensor, context_mask: torch.Tensor) -> torch.Tensor:
        attn = self.cross_attn
        q, k, v = attn.norm_q(attn.q(x)), attn.norm_k(attn.k(context)), attn.v(context)
        mask = context_mask[:, None, None, :].expand(-1, 1, x.shape[1], -1)
        return attn.o(attention(q, k, v, self.num_heads, mask, self.fp32).to(attn.o.weight.dtype))


class Stream(NamedTuple):
    """One expert's input to a MoT layer: its tokens, their adaLN projection, the embedded context,
    the RoPE rotations and the multiply's precision (a tuple, so FSDP's hooks see its tensors)."""

    tokens: torch.Tensor
    t_mod: torch.Tensor
    context: torch.Tensor
    context_mask: torch.Tensor
    rotations: torch.Tensor
    precision: torch.dtype


class MoTLayer(nn.Module):
    """Layer i of both experts and their joint attention: queries, keys and values of the streams it is
    given concatenated (video first), one masked attention, each stream finished by its own block.
    The policy runs the video stream alone (its keys and values are returned; `finish=False` stops
    there) and the action stream against them (`cached`): the joint mask lets no video query read an
    action key, so that is the joint attention's result, and the backward pass never reaches a video
    block through the mask's zeros."""

    def __init__(self, blocks: dict[str, Block], num_heads: int, fp32: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleDict(blocks)
        self.num_heads, self.fp32 = num_heads, fp32

    def block(self, name: str) -> Block:
        return cast(Block, self.blocks[name])

    def forward(
        self,
        streams: dict[str, Stream],
        mask: torch.Tensor,
        cached: tuple[torch.Tensor, torch.Tensor] | None = None,
        finish: bool = True,
    ) -> tuple[dict[str, torch.Tensor], tuple[torch.Tensor, torch.Tensor] | None]:
        """(each stream's new tokens, none unless `finish`; the video keys and values when the video
        stream ran)."""
        names: list[str] = [name for name in ("video", "action") if name in streams]
        mods: dict[str, Modulation] = {}
        qs, ks, vs = [], [], []
        for name in names:
            stream, block = streams[name], self.block(name)
            mods[name] = block.modulation_terms(stream.t_mod)
            q, k, v = block.qkv(stream.tokens, mods[name], stream.rotations, stream.precision, finish)
            qs.append(q)
            ks.append(k)
            vs.append(v)
        video_kv = (ks[0], vs[0]) if names[0] == "video" else None
        if not finish:
            return {}, video_kv
        if cached is not None:
            ks, vs = [cached[0], *ks], [cached[1], *vs]
        queries = [q for q in qs if q is not None]
        q, k, v = (torch.cat(parts, dim=1) if len(parts) > 1 else parts[0] for parts in (queries, ks, vs))
        mixed = attention(q, k, v, self.num_heads, mask, self.fp32).split(
            [streams[name].tokens.shape[1] for name in names], dim=1
        )
        out = {
            name: self.block(name).finish(streams[name].tokens, part, mods[name], streams[name].context, streams[name].context_mask)
            for name, part in zip(names, mixed, strict=True)
        }  # fmt: skip
        return out, video_kv


EMBEDDING_STD = 0.02  # Wan's text and time embeddings' weights


def time_modules(freq_dim: int, hidden: int, wan: bool) -> tuple[nn.Sequential, nn.Sequential]:
    """Wan's `time_embedding` (Linear, SiLU, Linear) and `time_projection` (SiLU, Linear to 6 x hidden),
    each Linear a `Projection` unit."""
    embedding = nn.Sequential(
        Projection(freq_dim, hidden, wan, EMBEDDING_STD),
        nn.SiLU(),
        Projection(hidden, hidden, wan, EMBEDDING_STD),
    )
    return embedding, nn.Sequential(nn.SiLU(), Projection(hidden, hidden * 6, wan, XAVIER))


def text_embedding(text_dim: int, hidden: int, wan: bool) -> nn.Sequential:
    """Wan's `text_embedding`: Linear, GELU(tanh), Linear, each Linear a `Projection` unit."""
    return nn.Sequential(
        Projection(text_dim, hidden, wan, EMBEDDING_STD),
        nn.GELU(approximate="tanh"),
        Projection(hidden, hidden, wan, EMBEDDING_STD),
    )


class Embedded(NamedTuple):
    """What an expert's embedding gives the MoT layers and its head (a tuple, so FSDP's hooks see its
    tensors)."""

    tokens: torch.Tensor
    t: torch.Tensor
    t_mod: torch.Tensor
    context: torch.Tensor
    grid: tuple[int, int, int]


class PatchEmbedding(nn.Conv3d):
    """The video expert's patch embedding: torch's Conv3d, its kernel then Xavier-uniform over its
    flattened (in x patch) fan-in, as Wan's `init_weights` leaves it."""

    def __init__(self, in_dim: int, hidden: int, patch: tuple[int, int, int]) -> None:
        super().__init__(in_dim, hidden, kernel_size=patch, stride=patch)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        with torch.no_grad():
            nn.init.xavier_uniform_(self.weight.view(self.weight.shape[0], -1))


class VideoHead(nn.Module):
    """Wan's head: LayerNorm modulated by `modulation + t` (per token), Linear to patch x channels."""

    def __init__(self, hidden: int, out_dim: int, patch: tuple[int, int, int], eps: float) -> None:
        super().__init__()
        self.norm = LayerNorm(hidden, eps, elementwise_affine=False)
        self.head = WanLinear(hidden, math.prod(patch) * out_dim, std=0.0)
        self.modulation = nn.Parameter(torch.empty(1, 2, hidden))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.modulation.normal_(0.0, self.modulation.shape[-1] ** -0.5)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        shift, scale = (self.modulation.unsqueeze(0) + t.unsqueeze(2)).chunk(2, dim=2)
        return self.head(self.norm(x) * (1 + scale.squeeze(2)) + shift.squeeze(2))


class VideoExpert(nn.Module):
    """The video DiT's own parts (its blocks live in the MoT layers): patch, text and time embeddings
    and the head. `forward` embeds noisy latents (B, 48, F, H, W) with a timestep per sample; latent
    frame 0 (the clean first frame) gets timestep 0."""

    def __init__(self, size: VideoSize) -> None:
        super().__init__()
        self.size = size
        self.patch_embedding = PatchEmbedding(size.in_dim, size.hidden_dim, size.patch_size)
        self.text_embedding = text_embedding(size.text_dim, size.hidden_dim, wan=True)
        self.time_embedding, self.time_projection = time_modules(size.freq_dim, size.hidden_dim, wan=True)
        self.head = VideoHead(size.hidden_dim, size.out_dim, size.patch_size, size.eps)

    def forward(self, latents: torch.Tensor, timestep: torch.Tensor, context: torch.Tensor) -> Embedded:
        dtype = self.patch_embedding.weight.dtype
        x = self.patch_embedding(latents.to(dtype))
        b, _, f, h, w = x.shape
        steps = timestep.to(dtype).view(b, 1, 1) * torch.ones((b, f, h * w), dtype=dtype, device=x.device)
        steps[:, 0] = 0
        t = self.time_embedding(sinusoid(self.size.freq_dim, steps.reshape(-1)).float().to(dtype))
        t = t.reshape(b, f * h * w, -1)
        t_mod = self.time_projection(t).unflatten(2, (6, self.size.hidden_dim)).to(dtype)
        tokens = x.flatten(2).transpose(1, 2)
        return Embedded(tokens, t, t_mod, self.text_embedding(context.to(dtype)), (f, h, w))

    def unpatchify(self, x: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
        """(B, f*h*w, patch x C) -> (B, C, f*pf, h*ph, w*pw), Wan's `fhwpqrc -> cfphqwr`."""
        f, h, w = grid
        pf, ph, pw = self.size.patch_size
        x = x.reshape(x.shape[0], f, h, w, pf, ph, pw, self.size.out_dim)
        return torch.einsum("bfhwpqrc->bcfphqwr", x).reshape(
            x.shape[0], self.size.out_dim, f * pf, h * ph, w * pw
        )


class ActionHead(nn.Linear):
    """The action expert's head: a plain Linear (no norm, no modulation)."""


class ActionExpert(nn.Module):
    """The action DiT's own parts: the action encoder, text and time embeddings and the head.
    `forward` embeds noisy actions (B, H, A) with a timestep per sample (or one for all)."""

    def __init__(self, size: ActionSize) -> None:
        super().__init__()
        self.size = size
        self.action_encoder = nn.Linear(size.action_dim, size.hidden_dim)
        self.text_embedding = text_embedding(size.text_dim, size.hidden_dim, wan=False)
        self.time_embedding, self.time_projection = time_modules(size.freq_dim, size.hidden_dim, wan=False)
        self.head = ActionHead(size.hidden_dim, size.action_dim)

    def forward(self, actions: torch.Tensor, timestep: torch.Tensor, context: torch.Tensor) -> Embedded:
        dtype = self.action_encoder.weight.dtype
        timestep = timestep.expand(actions.shape[0])
        t = self.time_embedding(sinusoid(self.size.freq_dim, timestep).to(dtype))
        t_mod = self.time_projection(t).unflatten(1, (6, self.size.hidden_dim))
        tokens = self.action_encoder(actions.to(dtype))
        return Embedded(tokens, t, t_mod, self.text_embedding(context.to(dtype)), (actions.shape[1], 1, 1))


class MoT(nn.Module):
    """Both experts' own parts (`mixtures`) and their paired blocks (`layers`)."""

    def __init__(self, video: VideoSize, action: ActionSize) -> None:
        super().__init__()
        self.mixtures = nn.ModuleDict({"video": VideoExpert(video), "action": ActionExpert(action)})
        self.layers = nn.ModuleList(
            MoTLayer(
                {
                    "video": Block(video.hidden_dim, video.ffn_dim, video.num_heads, video.attn_head_dim, video.eps, video.fp32_attention, wan=True),
                    "action": Block(action.hidden_dim, action.ffn_dim, action.num_heads, action.attn_head_dim, action.eps, action.fp32_attention, wan=False),
                },
                video.num_heads,
                video.fp32_attention,
            )
            for _ in range(video.num_layers)
        )  # fmt: skip

    @property
    def video(self) -> VideoExpert:
        return cast(VideoExpert, self.mixtures["video"])

    @property
    def action(self) -> ActionExpert:
        return cast(ActionExpert, self.mixtures["action"])

    def paired(self) -> list[MoTLayer]:
        return [cast(MoTLayer, layer) for layer in self.layers]
