"""LeRobot's ACT checkpoints read by our ACT, and ours written for LeRobot: its config.json schema and
its tensor names, both ways.

Why a name map rather than LeRobot's names on our modules: LeRobot's attention is
`nn.MultiheadAttention`, whose query/key/value projections are one fused `in_proj_weight` (3*d, d);
ours keeps them as separate `q_proj`/`k_proj`/`v_proj` so that LoRA can target each (policies/act/modules.py). A module
rename cannot split a tensor, so the weights are mapped on read instead: LeRobot's `model.` prefix
dropped, each `in_proj_*` split in three, a layer's `linear1`/`linear2` put under our `ffn.`, and the
persistent `vae_encoder_pos_enc` buffer (a fixed sinusoid ours recomputes) dropped once its shape is
checked. The trunk's names are torchvision's on both sides. Every other name is LeRobot's already.
`state_to_lerobot` and `config_to_lerobot` are the reverse (`trainer export`): the projections fused
back in LeRobot's q, k, v order, the buffer written as LeRobot computes it, LeRobot's ACTConfig fields.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Collection
from typing import Any

import torch
from torch import nn

from trainer.config.policy import LEROBOT_RUN_FIELDS, LeRobotAdapter
from trainer.data.dataset import ACTION_KEY, ALL_CAMERAS, ENV_KEY, OBS_KEY, is_camera
from trainer.data.pipeline import lerobot_schema
from trainer.errors import ConfigError
from trainer.policies.act.config import ACTConfig

# The normalization our ACT's processors apply; a LeRobot config.json asking for another is refused.
MEAN_STD = {"VISUAL": "MEAN_STD", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"}
_PREFIX = "model."
_IN_PROJ = re.compile(r"^(.*\.(?:self_attn|multihead_attn))\.in_proj_(weight|bias)$")
_FFN = re.compile(r"^(.*\.layers\.\d+)\.(linear[12]\.(?:weight|bias))$")
_POS_ENC = "vae_encoder_pos_enc"
_SPLIT = re.compile(r"^(.*\.(?:self_attn|multihead_attn))\.([qkv])_proj\.(weight|bias)$")
_OUR_FFN = re.compile(r"^(.*\.layers\.\d+)\.ffn\.(linear[12]\.(?:weight|bias))$")
# LeRobot 0.6.1's ACTConfig fields after its run fields, in its order: ours under the same names.
_LEROBOT_FIELDS = (
    "chunk_size", "n_action_steps", "normalization_mapping", "vision_backbone",
    "pretrained_backbone_weights", "replace_final_stride_with_dilation", "pre_norm", "dim_model",
    "n_heads", "dim_feedforward", "feedforward_activation", "n_encoder_layers", "n_decoder_layers",
    "use_vae", "latent_dim", "n_vae_encoder_layers", "temporal_ensemble_coeff", "dropout", "kl_weight",
    "optimizer_lr", "optimizer_weight_decay", "optimizer_lr_backbone",
)  # fmt: skip


def is_lerobot_state(names: Collection[str]) -> bool:
    """Whether tensor `names` (a state dict's keys) are LeRobot's: every ACT tensor of LeRobot's sits
    under `model.`."""
    return bool(names) and all(name.startswith(_PREFIX) for name in names)


def state_from_lerobot(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """LeRobot's ACT state dict under our names (the tensors themselves, or views of the fused ones)."""
    out: dict[str, torch.Tensor] = {}
    for lerobot_name, tensor in state.items():
        name = lerobot_name.removeprefix(_PREFIX)
        if name == _POS_ENC:
            continue  # recomputed by our ACT; its size follows chunk_size and the state, checked there
        fused = _IN_PROJ.match(name)
        if fused:
            if tensor.shape[0] % 3:
                raise ConfigError(
                    f"LeRobot tensor {lerobot_name} has {tensor.shape[0]} rows, not 3 x dim_model: the weights are damaged"
                )
            for proj, part in zip(("q_proj", "k_proj", "v_proj"), tensor.chunk(3, dim=0), strict=True):
                out[f"{fused[1]}.{proj}.{fused[2]}"] = part
            continue
        ffn = _FFN.match(name)
        out[f"{ffn[1]}.ffn.{ffn[2]}" if ffn else name] = tensor
    return out


def config_from_lerobot(saved: dict[str, Any]) -> dict[str, Any]:
    """A LeRobot ACT config.json (typed feature dicts, its run fields) as our ACTConfig's fields; a
    config already ours (`input_features` a list) is returned as it is."""
    features = saved.get("input_features")
    if not isinstance(features, dict):
        return saved
    mapping = saved.get("normalization_mapping", MEAN_STD)
    if mapping != MEAN_STD:
        raise ConfigError(
            f"the ACT config.json normalizes with {mapping}; this ACT normalizes every feature by mean and "
            "std (MEAN_STD): retrain with LeRobot's default normalization_mapping"
        )
    skip = {*LEROBOT_RUN_FIELDS, "output_features", "normalization_mapping", "input_features"}
    out = {k: v for k, v in saved.items() if k not in skip}
    widths = {"STATE": 0, "ENV": 0}
    state: list[str] = []
    cameras: dict[str, list[int]] = {}
    for name, feature in features.items():
        kind, shape = feature.get("type"), [int(s) for s in feature.get("shape", [])]
        if kind in widths:
            widths[kind] = shape[0]
            state.append(name)
        elif kind == "VISUAL":
            cameras[name] = shape
        else:
            raise ConfigError(
                f"the ACT config.json has input feature {name!r} of type {kind!r}, which ACT does not read"
            )
    state.sort(key=lambda name: name == ENV_KEY)  # the robot's state first, the environment's last
    action = (saved.get("output_features") or {}).get(ACTION_KEY, {})
    out.update(
        input_features=[*state, *cameras],
        image_shapes=cameras,
        obs_dim=widths["STATE"] + widths["ENV"],
        env_state_dim=widths["ENV"],
        action_dim=int(action.get("shape", [0])[0]),
    )
    return out


def state_to_lerobot(state: dict[str, torch.Tensor], pos_enc: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """Our ACT's state dict under LeRobot's names and shapes, the reverse of `state_from_lerobot`:
    `model.` prefixed, each attention's q/k/v fused into `in_proj_*` (rows in q, k, v order),
    `ffn.linear*` back to `linear*`, and `pos_enc` (the CVAE encoder's table, None without `use_vae`)
    as LeRobot's persistent `vae_encoder_pos_enc`."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        split = _SPLIT.match(name)
        if split:
            if split[2] == "q":
                parts = [state[f"{split[1]}.{p}_proj.{split[3]}"] for p in "qkv"]
                out[f"{_PREFIX}{split[1]}.in_proj_{split[3]}"] = torch.cat(parts, dim=0)
            continue
        ffn = _OUR_FFN.match(name)
        out[_PREFIX + (f"{ffn[1]}.{ffn[2]}" if ffn else name)] = tensor
    if pos_enc is not None:
        out[_PREFIX + _POS_ENC] = pos_enc
    return out


def input_features(ours: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Our ACTConfig's inputs as LeRobot's typed features: the robot state (STATE), the environment
    state at the end of our `observation.state` (ENV), each camera (VISUAL, (C, H, W))."""
    obs_dim, env_dim = ours["obs_dim"], ours["env_state_dim"]
    features: dict[str, Any] = {}
    if obs_dim > env_dim:
        features[OBS_KEY] = {"type": "STATE", "shape": [obs_dim - env_dim]}
    if env_dim:
        features[ENV_KEY] = {"type": "ENV", "shape": [env_dim]}
    for name in _cameras(ours):
        features[name] = {"type": "VISUAL", "shape": list(ours["image_shapes"].get(name, []))}
    return features


def _cameras(ours: dict[str, Any]) -> list[str]:
    return [name for name in ours["input_features"] if is_camera(name) and name != ALL_CAMERAS]


def config_to_lerobot(ours: dict[str, Any]) -> dict[str, Any]:
    """Our ACTConfig's fields as LeRobot 0.6.1's ACT config.json, the reverse of `config_from_lerobot`
    (`ACTPolicy.from_pretrained` refuses a field it does not know): the float vectors one
    `observation.state` (STATE, concatenated in `input_features` order) but for the environment
    state's width (`observation.environment_state`, ENV), each camera a VISUAL feature, LeRobot's run
    fields at its defaults. LeRobot's ACT needs a camera or an environment state, so an ACT reading
    only a state vector is refused, and so is one that read the environment state inside its robot
    state (LeRobot's would read it as its own token)."""
    if ENV_KEY in ours["input_features"] and not ours["env_state_dim"]:
        raise ConfigError(
            f"this ACT reads {ENV_KEY} inside {OBS_KEY} (env_state_dim 0), and LeRobot's ACT reads it as "
            "its own token: train it again (the environment state is then its own token) to export it"
        )
    if not _cameras(ours) and not ours["env_state_dim"]:
        raise ConfigError(
            "LeRobot's ACT needs a camera or observation.environment_state among its inputs, and this "
            "ACT reads only a state vector: train it with a camera (or --policy.env_state_dim) to export it"
        )
    return {
        "type": "act",
        "n_obs_steps": ours["n_obs_steps"],
        "input_features": input_features(ours),
        "output_features": {ACTION_KEY: {"type": "ACTION", "shape": [ours["action_dim"]]}},
        "device": ours["device"],
        **LEROBOT_RUN_FIELDS,
        **{
            name: dict(MEAN_STD) if name == "normalization_mapping" else ours[name]
            for name in _LEROBOT_FIELDS
        },
    }


class ACTAdapter(LeRobotAdapter[ACTConfig]):
    """LeRobot's ACT, both ways, through the functions above. Its names are not streamed into shards
    (`names_from_lerobot` is None): a fused projection is split on read, so the policy reads them whole."""

    def config_from_lerobot(
        self, saved: dict[str, Any], preprocessor: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        return config_from_lerobot(saved)

    def config_to_lerobot(self, config: ACTConfig) -> dict[str, Any]:
        return config_to_lerobot(dataclasses.asdict(config))

    def pipeline(self, config: ACTConfig) -> lerobot_schema.LeRobotPipeline:
        """LeRobot's `make_act_pre_post_processors`: rename, batch axis, device, then the normalizer over
        the inputs and the action, every type MEAN_STD but the environment state (no ENV entry)."""
        features = input_features(dataclasses.asdict(config))
        features[ACTION_KEY] = {"type": "ACTION", "shape": [config.action_dim]}
        before = (lerobot_schema.rename(), lerobot_schema.to_batch(), lerobot_schema.device())
        return lerobot_schema.LeRobotPipeline(before, features, dict(MEAN_STD))

    def is_lerobot_state(self, names: Collection[str]) -> bool:
        return is_lerobot_state(names)

    def state_from_lerobot(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return state_from_lerobot(state)

    def state_to_lerobot(self, config: ACTConfig, policy: nn.Module) -> dict[str, torch.Tensor]:
        """Our weights under LeRobot's names, its fused projections and its persistent CVAE table (a
        buffer ours does not save)."""
        pos_enc = dict(policy.named_buffers())["vae_encoder_pos_enc"] if config.use_vae else None
        return state_to_lerobot(policy.state_dict(), pos_enc)

    def tensors_to_lerobot(
        self, config: ACTConfig, tensors: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """Moments renamed and fused as their weights are; no CVAE table (a buffer has none)."""
        return state_to_lerobot(tensors, None)

    def lerobot_param_groups(
        self, config: ACTConfig, names: list[str]
    ) -> list[tuple[list[str], dict[str, Any]]]:
        """LeRobot's ACT: every parameter but the trunk's, then the trunk's at `optimizer_lr_backbone`
        (its second group is there, empty, for an ACT without a camera)."""
        trunk = [name for name in names if name.startswith(_PREFIX + "backbone")]
        rest = [name for name in names if name not in trunk]
        return [(rest, {}), (trunk, {"lr": config.optimizer_lr_backbone})]
