"""`--policy.path`: start from a pretrained policy, read through ckpt-tools.

The path is a local step directory, `pretrained_model/` or converted model directory, or a Hub repo id
(downloaded with huggingface_hub when online). Its `config.json` supplies the policy's fields at parse
time (flags still override them); its weights go into the freshly built policy before PEFT wrapping and
`prepare()`. A PEFT checkpoint is usable too: its adapter is merged into the base it records.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import ckpt_tools
from ckpt_tools import layout
from trainer.config.policy import RUN_FIELDS, PolicyConfig
from trainer.errors import ConfigError

if TYPE_CHECKING:
    import torch

_REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
_PATH_FLAG = "--policy.path="


def resolve(path: str) -> str:
    """A local directory (or fsspec URL) holding the policy: `path` itself, or its Hub snapshot."""
    if layout.is_url(path) or os.path.exists(path):
        return path
    if not _REPO_ID.match(path):
        raise ConfigError(f"--policy.path={path}: no such directory; give a model or step directory")
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(path, repo_type="model")
    except Exception as exc:  # offline, unknown repo, no access: all end the run the same way
        raise ConfigError(
            f"--policy.path={path}: not a local directory, and the Hub repo could not be downloaded "
            f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]}); check the path or repo id, "
            "or download it first and pass the local directory"
        ) from None


def base_policy_config(path: str) -> dict[str, Any]:
    """The saved policy config (`config.json`) at `path`, with `path` recorded."""
    with _checkpoint_errors(path):
        local = resolve(path)
        saved = ckpt_tools.open_checkpoint(local).policy_config()
        config = upgrade_policy_config(saved, saved_preprocessor(ckpt_tools.load_processors(local)))
    if not isinstance(config.get("type"), str):
        raise ConfigError(f"--policy.path={path}: its config.json names no policy type")
    return {**config, "path": path}


@contextlib.contextmanager
def policy_defaults(args: list[str], config_path: str | None) -> Iterator[str | None]:
    """The config file to parse with: `config_path` unchanged without a `--policy.path` flag, else a
    temporary copy whose policy section is the base's config.json (a `--config_path` file's own policy
    fields of the same type win over it, flags win over both). A saved policy section of an earlier
    release is upgraded on the way (`upgrade_policy_config`: the state-only `act` is `act_state`)."""
    path = next((a.removeprefix(_PATH_FLAG) for a in reversed(args) if a.startswith(_PATH_FLAG)), None)
    data = _read_json_file(config_path) if config_path is not None else {}
    if path is None:
        own = data.get("policy")
        if not isinstance(own, dict) or upgrade_policy_config(own) is own:
            yield config_path
            return
        data["policy"] = upgrade_policy_config(own)  # a run saved before ACT became LeRobot's
        with _written(data) as upgraded:
            yield upgraded
        return
    # the base's run settings (LeRobot's config.json records its device and Hub repo) are not inherited:
    # a fine-tune chooses its own device and never publishes over the base's repo by default
    base = {k: v for k, v in base_policy_config(path).items() if k not in RUN_FIELDS}
    own = data.get("policy")
    own = own if isinstance(own, dict) else {}
    same_type = own.get("type") == base["type"]
    data["policy"] = {**base, **(own if same_type else {}), "path": path}
    explicit = next((a.split("=", 1)[1] for a in reversed(args) if a.startswith("--policy.type=")), None)
    if explicit is not None and explicit != base["type"]:
        raise ConfigError(
            f"--policy.type={explicit} but --policy.path={path} holds a {base['type']} policy: drop --policy.type"
        )
    if base["type"] not in PolicyConfig.get_known_choices() and ":" not in base["type"]:
        ours = ", ".join(t for t in PolicyConfig.get_known_choices() if ":" not in t)
        raise ConfigError(
            f"--policy.path={path} holds a {base['type']} policy, a type this trainer does not have: it "
            f"trains {ours} (or your own, --policy.type=module.path:ConfigClass)"
        )
    if base["type"] in PolicyConfig.get_known_choices():
        typed = {
            a.split("=", 1)[0].removeprefix("--policy."): a.split("=", 1)[1]
            for a in args
            if a.startswith("--policy.") and "=" in a
        }
        adapter = PolicyConfig.get_choice_class(base["type"]).lerobot_adapter()
        if adapter is not None:
            adapter.check_path_flags(base, typed, path)
    with _written(data) as merged:
        yield merged


@contextlib.contextmanager
def _written(data: dict[str, Any]) -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="trainer-config-") as tmp:
        file = os.path.join(tmp, "train_config.json")
        with open(file, "w", encoding="utf-8") as handle:
            json.dump(data, handle)
        yield file


def saved_preprocessor(processors: Mapping[str, ckpt_tools.ProcessorState]) -> dict[str, Any] | None:
    """The checkpoint's `policy_preprocessor.json` (None when it has none), which LeRobot's checkpoints
    record some settings in only (`LeRobotAdapter.config_from_lerobot`)."""
    state = processors.get(layout.PREPROCESSOR)
    return None if state is None else state.config


def load_weights(policy: Any, path: str) -> None:
    """Copy the pretrained weights at `path` into `policy` (every rank reads them; nothing is shared)."""
    fit_weights(policy, read_weights(path), path)


def read_weights(path: str, weights: str = "model") -> dict[str, torch.Tensor]:
    """The pretrained weights at `path` as a state dict (an adapter merged into the base it records);
    `weights="ema"` takes the checkpoint's EMA of its trained parameters instead of their last values."""
    local = resolve(path)
    with _checkpoint_errors(path):
        checkpoint = ckpt_tools.open_checkpoint(local)
        if checkpoint.is_adapter:
            base = resolve(_adapter_base(checkpoint.model_dir, path))
            return ckpt_tools.merge_adapter_dir(base, local, weights=weights)
        return ckpt_tools.load_model_state_dict(local, weights=weights)


def fit_weights(policy: Any, state: dict[str, Any], path: str) -> None:
    """Copy `state` (LeRobot's names renamed by the policy's adapter) into `policy`, refusing
    weights that do not fit it in one line."""
    state = under_own_names(policy.config, state)
    own = policy.state_dict()
    resized = next((n for n, t in state.items() if n in own and own[n].shape != t.shape), None)
    if resized is not None:
        raise ConfigError(
            f"--policy.path={path}: its tensor {resized} is {list(state[resized].shape)}, but the "
            f"{type(policy).__name__} built from the flags has {list(own[resized].shape)}: drop the --policy.* "
            "flags that change its shape"
        )
    missing, unexpected = [n for n in own if n not in state], [n for n in state if n not in own]
    if missing or unexpected:  # before anything is copied: a refused load leaves the policy as it was
        _refuse_misfit(policy, path, missing, unexpected, [])
    policy.load_state_dict(state)


def under_own_names(config: PolicyConfig, state: dict[str, Any]) -> dict[str, Any]:
    """`state` under the policy's own tensor names: LeRobot's renamed by the config's adapter
    (`LeRobotAdapter.state_from_lerobot`), ours as they are."""
    adapter = config.lerobot_adapter()
    if adapter is None or not adapter.is_lerobot_state(list(state)):
        return state
    return adapter.state_from_lerobot(state)


def is_adapter(path: str) -> bool:
    """Whether the weights at `path` are a PEFT adapter (merged into its base by `read_weights`)."""
    with _checkpoint_errors(path):
        return ckpt_tools.open_checkpoint(resolve(path)).is_adapter


def check_fits(
    policy: Any, path: str, shapes: Mapping[str, tuple[int, ...]], saved_names: dict[str, str] | None = None
) -> None:
    """Refuse, in one line, weights at `path` whose names or `shapes` (`saved_shapes`: its headers)
    differ from `policy`'s, which may still be on the meta device: nothing is allocated or read yet.
    `saved_names` (`LeRobotAdapter.names_from_lerobot`) reads LeRobot's names as the tensors they become."""
    names = saved_names if saved_names is not None else {name: name for name in shapes}
    saved = {name: shapes[saved] for name, saved in names.items()}
    wanted = {name: tuple(t.shape) for name, t in policy.state_dict().items()}
    missing, unexpected = sorted(wanted.keys() - saved.keys()), sorted(saved.keys() - wanted.keys())
    resized = [
        f"{name} is {list(saved[name])} there but {list(wanted[name])} here"
        for name in sorted(wanted.keys() & saved.keys())
        if wanted[name] != saved[name]
    ]
    if missing or unexpected or resized:
        _refuse_misfit(policy, path, missing, unexpected, resized)


def stream_weights(policy: Any, path: str, saved_names: dict[str, str] | None = None) -> None:
    """Collective on a sharded policy: the weights at `path` into `policy`'s tensors, each rank reading
    only the blocks it holds (`ckpt_tools.training.load_model_weights`); `check_fits` has passed. `saved_names`
    maps the tensors to fill to their saved names when `policy` wraps the saved one (PEFT) or the saved
    names are LeRobot's (`LeRobotAdapter.names_from_lerobot`)."""
    with _checkpoint_errors(path):
        ckpt_tools.training.load_model_weights(resolve(path), policy, saved_names=saved_names)


def saved_shapes(path: str) -> dict[str, tuple[int, ...]]:
    """The tensors' names and shapes in the weights at `path`, from the headers alone (a meta build
    reads them once: which names they are, whether they fit)."""
    with _checkpoint_errors(path):
        weights = ckpt_tools.describe_checkpoint(resolve(path)).weights
    return {t.name: tuple(t.shape) for t in weights.tensors} if weights is not None else {}


def _refuse_misfit(
    policy: Any, path: str, missing: list[str], unexpected: list[str], resized: list[str]
) -> None:
    first = (
        f"missing {missing[0]}" if missing else f"unexpected {unexpected[0]}" if unexpected else resized[0]
    )
    sizes = f"{len(missing)} missing, {len(unexpected)} unexpected" + (
        f", {len(resized)} resized" if resized else ""
    )
    raise ConfigError(
        f"--policy.path={path}: its weights do not fit the {type(policy).__name__} built from the flags "
        f"({sizes}; {first}): drop the --policy.* flags that change its shape"
    )


def _adapter_base(model_dir: str, path: str) -> str:
    """The base model a PEFT checkpoint records in `adapter_config.json`."""
    adapter_config = _read_json_file(layout.join(model_dir, layout.ADAPTER_CONFIG))
    base = adapter_config.get("base_model_name_or_path")
    if not isinstance(base, str) or not base:
        raise ConfigError(
            f"--policy.path={path} is an adapter that does not record its base model: merge it first "
            "with `ckpt merge-adapter --base BASE` and pass the merged directory"
        )
    return base


def _read_json_file(path: str) -> dict[str, Any]:
    """A config file (bounded in size and depth: it may come from a downloaded checkpoint)."""
    try:
        return ckpt_tools.read_config_json(path)
    except ckpt_tools.CheckpointError as exc:
        raise ConfigError(f"{path}: {exc}") from None


@contextlib.contextmanager
def _checkpoint_errors(path: str) -> Iterator[None]:
    try:
        yield
    except ckpt_tools.CheckpointError as exc:
        raise ConfigError(f"--policy.path={path}: {exc}") from None


# Fields only the state-only ACT has: a saved `type: act` config holding one of them predates LeRobot's ACT.
_LEGACY_ACT_FIELDS = frozenset(
    {"dim", "heads", "ffn_dim", "encoder_layers", "decoder_layers", "context_tokens", "chunk"}
)


def upgrade_policy_config(
    saved: dict[str, Any], preprocessor: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A saved policy config (config.json, or train_config.json's `policy` section) in today's terms:
    an `act` config with the fields of the earlier state-only ACT becomes `act_state`; any other config
    is returned unchanged, but for a type whose config.json follows another tool's schema
    (its adapter's `config_from_lerobot`: LeRobot's SmolVLA; `preprocessor`, the checkpoint's
    policy_preprocessor.json, for what LeRobot records there only)."""
    if saved.get("type") == "act" and _LEGACY_ACT_FIELDS & saved.keys():
        return {**saved, "type": "act_state"}
    kind = saved.get("type")
    if isinstance(kind, str) and kind in PolicyConfig.get_known_choices():
        adapter = PolicyConfig.get_choice_class(kind).lerobot_adapter()
        return saved if adapter is None else adapter.config_from_lerobot(saved, preprocessor)
    return saved
