"""FastWAM's frozen parts, read from where the config names them and never saved with the policy: the
UMT5 tokenizer (`tokenizer_model_id`), the UMT5 text encoder (`<text_encoder_model_id>/text_encoder`)
and the Wan2.2 VAE (`<text_encoder_model_id>/vae`: LeRobot hard-codes Wan-AI/Wan2.2-TI2V-5B-Diffusers
there, the repo `text_encoder_model_id` names by default).

A name is a directory (relative to the working directory, as LeRobot reads it, else to the checkpoint
`--policy.path` names) or a Hub repo id read through the Hugging Face cache; one that does not resolve
is one line naming the field (`locate_all`, when the policy is built). They are loaded on first use on the
batch's device, in the policy's dtype, in eval mode, outside the module tree (so `state_dict`,
`train()`, FSDP and the optimizer never see them). Of the VAE only the encoder is read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trainer.errors import ConfigError
from trainer.policies.common.vla.hub import TOKENIZER_FILES, import_transformers, resolve_pretrained
from trainer.policies.fastwam.config import FastWAMConfig

# Distinct prompts whose embeddings are kept (one (tokenizer_max_len, d_model) row each: about 1 MB in
# bfloat16 at LeRobot's size); a dataset with more distinct tasks encodes the others at every use.
PROMPT_CACHE = 1024
VAE_WEIGHTS = "diffusion_pytorch_model.safetensors"  # diffusers' weights file (or its shards' index)
PARTS = {  # field, subfolder, the file it must hold
    "tokenizer": ("tokenizer_model_id", "", TOKENIZER_FILES),
    "text encoder": ("text_encoder_model_id", "text_encoder", ("config.json",)),
    "VAE": ("text_encoder_model_id", "vae", ("config.json",)),
}


def locate(config: FastWAMConfig, what: str) -> Path:
    """The directory holding the frozen part `what`; one line naming the field when there is none."""
    field, subfolder, files = PARTS[what]
    name = getattr(config, field)
    if not os.path.isabs(name) and not os.path.exists(name) and config.path and os.path.isdir(config.path):
        beside = Path(config.path, name)
        name = str(beside) if beside.exists() else name
    directory = Path(resolve_pretrained(name, f"--policy.{field}", weights=True), subfolder).absolute()
    if not any((directory / file).is_file() for file in files):
        raise ConfigError(
            f"--policy.{field}={getattr(config, field)}: {directory} holds no {what} ({files[0]}); give the "
            "diffusers Wan2.2 repo or a directory with text_encoder/ and vae/ (and the UMT5 tokenizer)"
        )
    return directory


def locate_all(config: FastWAMConfig) -> dict[str, Path]:
    """Every frozen part's directory, resolved when the policy is built (later loads do not depend on
    the working directory)."""
    return {what: locate(config, what) for what in PARTS}


@dataclass
class FrozenParts:
    """The loaded tokenizer, text encoder and VAE with its latent standardization (mean, std), and the
    embeddings of the prompts seen so far: a prompt depends on its task only, and a dataset has a
    handful, so the frozen encoder runs once per distinct task instead of at every step.

    `keep_prompts_only` drops the encoder once every prompt a run will read is kept (the engine's
    `Policy.prepare_tasks`, before step 1): at LeRobot's size that is 5.68 B parameters (11 GB in
    bfloat16) no longer beside training. A prompt met later (a rollout's own task) loads it again
    through `load_text_encoder`."""

    tokenizer: Any
    text_encoder: Any | None  # transformers' UMT5EncoderModel; None once released
    vae: Any  # diffusers' AutoencoderKLWan, its encoder only
    latents_mean: torch.Tensor
    latents_std: torch.Tensor
    load_text_encoder: Callable[[], Any]
    prompts: dict[str, torch.Tensor] = field(default_factory=dict)

    def encode_prompts(self, prompts: list[str], max_length: int, device: torch.device) -> torch.Tensor:
        """(B, max_length, d_model), each prompt's embeddings: kept ones as they are, the others
        encoded together (`encode`) and kept while fewer than PROMPT_CACHE are."""
        missing = list(dict.fromkeys(p for p in prompts if p not in self.prompts))
        fresh = dict(zip(missing, self.encode(missing, max_length, device), strict=True)) if missing else {}
        for prompt, rows in fresh.items():
            if len(self.prompts) < PROMPT_CACHE:
                self.prompts[prompt] = rows
        return torch.stack([fresh[p] if p in fresh else self.prompts[p].to(device) for p in prompts])

    def keep_prompts_only(self, prompts: list[str], max_length: int, device: torch.device) -> bool:
        """Encode `prompts` and release the text encoder when all of them are kept; False (the encoder
        kept) when there are more distinct prompts than PROMPT_CACHE."""
        distinct = list(dict.fromkeys(prompts))
        if len(distinct) > PROMPT_CACHE:
            return False
        self.prompts.clear()
        self.encode_prompts(distinct, max_length, device)
        self.text_encoder = None
        return True

    def encode(self, prompts: list[str], max_length: int, device: torch.device) -> torch.Tensor:
        """(B, max_length, d_model): UMT5 on the padded prompts with their real mask, then every padded
        position zeroed (LeRobot's `encode_prompt`; its context mask is all ones)."""
        encoded = self.tokenizer(
            prompts, padding="max_length", truncation=True, max_length=max_length, return_tensors="pt"
        )
        ids, mask = encoded.input_ids.to(device), encoded.attention_mask.to(device)
        if self.text_encoder is None:
            self.text_encoder = self.load_text_encoder()
        with torch.no_grad():
            out = self.text_encoder(input_ids=ids, attention_mask=mask.long()).last_hidden_state
        return out * (torch.arange(max_length, device=device) < mask.sum(dim=1, keepdim=True))[..., None].to(
            out.dtype
        )

    def encode_video(self, video: torch.Tensor) -> torch.Tensor:
        """(B, 3, T, H, W) in [0, 1] -> standardized latents (B, 48, 1 + (T-1)/4, H/16, W/16), float32:
        the posterior mean of the VAE on `2 x - 1`, then `(mu - mean) / std` per channel."""
        weight = next(self.vae.parameters())
        with torch.no_grad():
            mu = (
                self.vae.encode((video * 2.0 - 1.0).to(weight.device, weight.dtype))
                .latent_dist.mode()
                .float()
            )
        return (mu - self.latents_mean.to(mu.device)) / self.latents_std.to(mu.device)


def load(
    config: FastWAMConfig, directories: dict[str, Path], device: torch.device, dtype: torch.dtype
) -> FrozenParts:
    """The frozen parts in `directories` (`locate_all`), frozen, in eval mode, on `device` in `dtype`."""
    transformers = import_transformers("fastwam", "fastwam")
    try:
        from diffusers import AutoencoderKLWan
    except ImportError:
        raise ConfigError(
            "--policy.type=fastwam needs diffusers: pip install 'ckpt-trainer[fastwam]'"
        ) from None
    tokenizer = transformers.AutoTokenizer.from_pretrained(directories["tokenizer"])

    def load_text_encoder() -> Any:
        encoder = transformers.UMT5EncoderModel.from_pretrained(
            directories["text encoder"], torch_dtype=dtype
        )
        text_dim = config.video_size().text_dim
        if encoder.config.d_model != text_dim:
            raise ConfigError(
                f"--policy.text_encoder_model_id={config.text_encoder_model_id}: its encoder gives "
                f"{encoder.config.d_model} values per token, the experts read --policy.video_dit_config "
                f"text_dim={text_dim}"
            )
        return _frozen(encoder, device)

    encoder = load_text_encoder()
    vae = _frozen(_vae_encoder(AutoencoderKLWan, directories["VAE"], dtype), device)
    z_dim = int(vae.config.z_dim)
    mean = torch.tensor(vae.config.latents_mean, dtype=torch.float32).view(1, z_dim, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std, dtype=torch.float32).view(1, z_dim, 1, 1, 1)
    return FrozenParts(tokenizer, encoder, vae, mean.to(device), std.to(device), load_text_encoder)


def _vae_encoder(vae_class: Any, directory: Path, dtype: torch.dtype) -> Any:
    """diffusers' Wan VAE with its encoder alone, its weights in `dtype`. FastWAM only encodes (the
    video is never imagined): Wan2.2's decoder, 555 M of the VAE's 705 M parameters (1.11 GB in
    bfloat16), is never read. The VAE is built on the meta device (diffusers counts the decoder's
    convolutions at construction; `encode` reads none) and the encoder's tensors are read from the
    directory's safetensors weights (diffusers' file, or the shards its index names); a directory
    without them (a variant, .bin weights) is read whole by diffusers and its decoder dropped."""
    from safetensors import safe_open

    index = directory / f"{VAE_WEIGHTS}.index.json"
    if index.is_file():
        files = sorted({directory / shard for shard in json.loads(index.read_text())["weight_map"].values()})
    else:
        files = [directory / VAE_WEIGHTS] if (directory / VAE_WEIGHTS).is_file() else []
    if not files:
        vae = vae_class.from_pretrained(directory, torch_dtype=dtype)
        vae.decoder = vae.post_quant_conv = None
        return vae
    with torch.device("meta"):
        vae = vae_class.from_config(vae_class.load_config(directory))
    vae.decoder = vae.post_quant_conv = None
    wanted, state = set(vae.state_dict()), {}
    for file in files:
        with safe_open(str(file), "pt") as weights:
            for name in wanted.intersection(weights.keys()):
                state[name] = weights.get_tensor(name).to(dtype)
    missing = sorted(wanted - set(state))
    if missing:
        raise ConfigError(
            f"{directory}: its weights lack {missing[0]} (and {len(missing) - 1} more) of the Wan VAE's "
            "encoder its config.json describes; give the diffusers Wan2.2 repo's vae/"
        )
    vae.load_state_dict(state, strict=True, assign=True)
    return vae


def _frozen(module: Any, device: torch.device) -> Any:
    """`module` without gradients, in eval mode, on `device`."""
    module.requires_grad_(False)
    module.eval()
    return module.to(device)
