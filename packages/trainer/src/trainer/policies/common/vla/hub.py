"""Pretrained files named as LeRobot names them (a backbone, a tokenizer): a directory (a relative
path from the working directory), else a Hub repo id read through the Hugging Face cache."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from trainer.errors import ConfigError


def resolve_pretrained(name: str, flag: str, weights: bool = False) -> str:
    """The local directory holding `name`'s config and tokenizer (and, with `weights`, its
    safetensors): `name` itself when it is a directory, else its snapshot in the Hugging Face cache
    (those files downloaded when online and not cached). `flag` names the setting in errors."""
    if os.path.isdir(name):
        return name
    if os.path.isabs(name) or name.startswith(".") or name.count("/") != 1:
        raise ConfigError(f"{flag}={name}: no such directory (a relative path is read from {os.getcwd()})")
    from huggingface_hub import snapshot_download

    try:
        patterns = ["*.json", "*.txt", "*.model", *(["*.safetensors"] if weights else [])]
        return snapshot_download(name, repo_type="model", allow_patterns=patterns)
    except Exception as exc:  # offline and not cached, unknown repo: the same one line
        raise ConfigError(
            f"{flag}={name}: not a local directory, and the Hub repo could not be read "
            f"({type(exc).__name__}); download it first (huggingface-cli download {name}) or give a directory"
        ) from None


def same_config(first: str, second: str, flag: str) -> bool:
    """Whether two names hold the same config.json (False when either cannot be read)."""
    try:
        configs = [
            json.loads(Path(resolve_pretrained(n, flag), "config.json").read_text()) for n in (first, second)
        ]
    except (ConfigError, OSError, ValueError):
        return False
    return configs[0] == configs[1]


def load_pretrained(name: str, flag: str, what: str, files: tuple[str, ...], auto: Any, needs: str) -> Any:
    """`auto.from_pretrained` of `name`'s directory, which must hold one of `files`; every failure is
    one line naming the setting (`needs` says what the policy reads it for and what to give)."""
    directory = resolve_pretrained(name, flag)
    if not any(os.path.isfile(os.path.join(directory, file)) for file in files):
        raise ConfigError(f"{flag}={name}: {directory} holds no {what} ({files[0]}); {needs}")
    try:
        return auto.from_pretrained(directory)
    except Exception as exc:  # transformers raises many types for a malformed file
        detail = " ".join(str(exc).split())[:160]
        raise ConfigError(
            f"{flag}={name}: its {what} does not load ({type(exc).__name__}: {detail})"
        ) from None


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def import_transformers(policy_type: str, extra: str) -> Any:
    """The `transformers` package, or one line naming the extra that installs it."""
    try:
        import transformers
    except ImportError:
        raise ConfigError(
            f"--policy.type={policy_type} needs transformers: pip install 'ckpt-trainer[{extra}]'"
        ) from None
    return transformers
