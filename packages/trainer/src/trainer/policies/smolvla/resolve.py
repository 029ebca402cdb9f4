"""`--policy.vlm_model_name` as LeRobot resolves it: a directory (a relative path from the working
directory), else a Hub repo id read through the Hugging Face cache."""

from __future__ import annotations

import json
import os
from pathlib import Path

from trainer.errors import ConfigError

FLAG = "--policy.vlm_model_name"


def resolve_backbone(name: str, weights: bool = False) -> str:
    """The local directory holding the backbone's config and tokenizer (and, with `weights`, its
    safetensors): `name` itself when it is a directory, else its snapshot in the Hugging Face cache
    (those files downloaded when online and not cached)."""
    if os.path.isdir(name):
        return name
    if os.path.isabs(name) or name.startswith(".") or name.count("/") != 1:
        raise ConfigError(f"{FLAG}={name}: no such directory (a relative path is read from {os.getcwd()})")
    from huggingface_hub import snapshot_download

    try:
        patterns = ["*.json", "*.txt", "*.model", *(["*.safetensors"] if weights else [])]
        return snapshot_download(name, repo_type="model", allow_patterns=patterns)
    except Exception as exc:  # offline and not cached, unknown repo: the same one line
        raise ConfigError(
            f"{FLAG}={name}: not a local directory, and the Hub repo could not be read "
            f"({type(exc).__name__}); download it first (huggingface-cli download {name}) or give a directory"
        ) from None


def same_backbone(first: str, second: str) -> bool:
    """Whether two backbone names hold the same config.json (False when either cannot be read)."""
    try:
        configs = [json.loads(Path(resolve_backbone(n), "config.json").read_text()) for n in (first, second)]
    except (ConfigError, OSError, ValueError):
        return False
    return configs[0] == configs[1]
