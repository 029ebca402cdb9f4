"""A dataset repo id resolved through the Hugging Face cache, downloaded once per node.

The dataset is read before the process group exists (its feature sizes shape the policy that the
accelerator wraps), so the ranks coordinate through the store torchrun's agent already serves at
MASTER_ADDR:MASTER_PORT: each node's first rank downloads, publishes the outcome under a key, and the
node's other ranks wait for it (bounded) and then read the cached snapshot without network.
"""

from __future__ import annotations

import functools
import os
from datetime import timedelta
from typing import Any

from trainer.errors import ConfigError

WAIT = timedelta(minutes=30)  # a large dataset's download; the others wait at most this long
_OK = "ok"


@functools.cache
def download_once(repo_id: str, revision: str | None = None) -> str:
    """The local snapshot directory of dataset `repo_id` at `revision` (a branch, tag or commit; None:
    the default branch)."""
    store = _agent_store()
    if store is None or int(os.environ.get("LOCAL_RANK", "0")) == 0:
        try:
            path = _snapshot(repo_id, revision, local_only=False)
        except ConfigError as exc:
            _publish(store, repo_id, revision, str(exc))
            raise
        _publish(store, repo_id, revision, _OK)
        return path
    key = _key(repo_id, revision)
    store.wait([key], WAIT)
    outcome = store.get(key).decode()
    if outcome != _OK:
        raise ConfigError(outcome)
    return _snapshot(repo_id, revision, local_only=True)


def _snapshot(repo_id: str, revision: str | None, local_only: bool) -> str:
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(repo_id, repo_type="dataset", revision=revision, local_files_only=local_only)
    except Exception as exc:  # offline without a cached copy, unknown repo, no access: one outcome
        raise ConfigError(
            f"--dataset.repo_id={repo_id}{_at(revision)}: no local copy in the Hugging Face cache and it could not be "
            f"downloaded ({type(exc).__name__}); pass the dataset directory with --dataset.root=PATH"
        ) from None


def _agent_store() -> Any:
    """torchrun's agent store, or None outside a torchrun launch (then every process downloads)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or int(os.environ.get("WORLD_SIZE", "1")) < 2:
        return None
    from torch.distributed import TCPStore

    return TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=WAIT)


def _at(revision: str | None) -> str:
    return f" --dataset.revision={revision}" if revision else ""


def _key(repo_id: str, revision: str | None = None) -> str:
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"trainer/dataset/{attempt}/{os.environ.get('GROUP_RANK', '0')}/{repo_id}@{revision or ''}"


def _publish(store: Any, repo_id: str, revision: str | None, outcome: str) -> None:
    if store is not None:
        store.set(_key(repo_id, revision), outcome)
