"""LeRobot's pi0 / pi0.5 state-dict names and this model's, both ways.

The names match but for the decoder layers, which pair up here (`paligemma_with_expert.layers.{i}.
paligemma` / `.expert`, the FSDP units) where LeRobot keeps two stacks. Loading applies LeRobot's own key
fixes for the Hub's openpi-converted checkpoints (`PI0Policy._fix_pytorch_state_dict_keys`): keys
without the `model.` prefix get it; among those, pi0 reads `time_mlp_*` as `action_time_mlp_*` and
pi0.5 the reverse, pi0.5 skips `state_proj` and the expert's plain norm weights; the token embedding is
PaliGemma's `lm_head` when the file has no `embed_tokens` (an openpi file ties them; a LeRobot-trained
one holds both, untied, and its `embed_tokens` wins). Both `lm_head`s are accepted and dropped: nothing
reads them. Export writes them back (the embedding, and zeros for the expert's) because LeRobot loads
strictly.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch

from trainer.errors import ConfigError
from trainer.policies.pi.config import Sizes

_PREFIX = "model.paligemma_with_expert."
_VLM_LAYER = re.compile(r"^model\.paligemma_with_expert\.paligemma\.model\.language_model\.layers\.(\d+)\.")
_EXPERT_LAYER = re.compile(r"^model\.paligemma_with_expert\.gemma_expert\.model\.layers\.(\d+)\.")
_OURS = re.compile(r"^model\.paligemma_with_expert\.layers\.(\d+)\.(paligemma|expert)\.")
EMBED = _PREFIX + "paligemma.model.language_model.embed_tokens.weight"
VLM_HEAD = _PREFIX + "paligemma.lm_head.weight"
EXPERT_HEAD = _PREFIX + "gemma_expert.lm_head.weight"
_PLAIN_EXPERT_NORM = re.compile(
    r"^paligemma_with_expert\.gemma_expert\.model\.(layers\.\d+\.(input_layernorm|post_attention_layernorm)|norm)\.weight$"
)


def from_lerobot(state: dict[str, torch.Tensor], pi05: bool) -> dict[str, torch.Tensor]:
    """A LeRobot (or openpi-converted) pi0 / pi0.5 state dict under this model's names (ours pass as
    they are)."""
    return {ours: state[saved] for ours, saved in names_from_lerobot(state, pi05).items()}


def names_from_lerobot(names: Iterable[str], pi05: bool) -> dict[str, str]:
    """This model's name -> the LeRobot (or openpi-converted) name it is read from, for each tensor a
    load keeps of `names` (LeRobot's key fixes, the token embedding from `lm_head` when the file has no
    `embed_tokens`, both `lm_head`s dropped); ours map to themselves."""
    fixed: dict[str, str] = {}  # LeRobot's name after its key fixes -> the saved name
    for name in names:
        key = name
        if not key.startswith("model."):
            renamed = _openpi_key(key, pi05)
            if renamed is None:
                continue
            key = "model." + renamed
        fixed[key] = name
    if EMBED not in fixed and VLM_HEAD in fixed:
        fixed[EMBED] = fixed[VLM_HEAD]
    fixed.pop(VLM_HEAD, None)
    fixed.pop(EXPERT_HEAD, None)
    return {_ours(key): saved for key, saved in fixed.items()}


def is_lerobots(names: Iterable[str]) -> bool:
    """Whether tensor names are LeRobot's or openpi's (its two decoder stacks, an `lm_head`, keys
    without the `model.` prefix) rather than this model's."""
    lerobot = (_VLM_LAYER, _EXPERT_LAYER)
    return any(
        not name.startswith("model.")
        or name in (VLM_HEAD, EXPERT_HEAD)
        or any(p.match(name) for p in lerobot)
        for name in names
    )


def _openpi_key(key: str, pi05: bool) -> str | None:
    """LeRobot's renames of an unprefixed (openpi-converted) key; None for a key it skips."""
    if pi05:
        if key.startswith("state_proj.") or _PLAIN_EXPERT_NORM.match(key):
            return None
        return re.sub(r"^action_time_mlp_(in|out)\.", r"time_mlp_\1.", key)
    return re.sub(r"^time_mlp_(in|out)\.", r"action_time_mlp_\1.", key)


def _ours(key: str) -> str:
    for pattern, stream in ((_VLM_LAYER, "paligemma"), (_EXPERT_LAYER, "expert")):
        match = pattern.match(key)
        if match:
            return f"{_PREFIX}layers.{match.group(1)}.{stream}.{key[match.end() :]}"
    return key


def to_lerobot(state: dict[str, torch.Tensor], sizes: Sizes) -> dict[str, torch.Tensor]:
    """This model's state dict under LeRobot's names, with the two `lm_head`s LeRobot's strict load needs."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        match = _OURS.match(key)
        if match:
            stack = (
                "paligemma.model.language_model" if match.group(2) == "paligemma" else "gemma_expert.model"
            )
            key = f"{_PREFIX}{stack}.layers.{match.group(1)}.{key[match.end() :]}"
        out[key] = value
    embed = out[EMBED]
    out[VLM_HEAD] = embed.clone()
    out[EXPERT_HEAD] = torch.zeros(sizes.vocab_size, sizes.expert.width, dtype=embed.dtype)
    return out


def load_lerobot(module: torch.nn.Module, state: dict[str, torch.Tensor], pi05: bool, where: str) -> None:
    """`state` (LeRobot's names) into `module` (a policy: its `model.` is the flow model) strictly; a
    missing, unexpected or misshapen tensor is one line naming it."""
    ours = from_lerobot(state, pi05)
    own = module.state_dict()
    missing = [k for k in own if k not in ours]
    unexpected = [k for k in ours if k not in own]
    misshapen = [k for k in own if k in ours and ours[k].shape != own[k].shape]
    for problem, keys in (("lacks", missing), ("has the unexpected tensor", unexpected)):
        if keys:
            raise ConfigError(
                f"{where} {problem} {keys[0]} ({len(keys)} in all): it is not a checkpoint of this "
                "pi0/pi05 config (check --policy.size_overrides and the variants)"
            )
    if misshapen:
        key = misshapen[0]
        raise ConfigError(
            f"{where}: {key} has shape {list(ours[key].shape)}, the model {list(own[key].shape)}: check "
            "--policy.size_overrides and the variants"
        )
    module.load_state_dict(ours, strict=True)
