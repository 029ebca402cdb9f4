"""A directory placed in the Hugging Face cache as a repo snapshot, as `snapshot_download` leaves it,
so code that resolves a repo id through the cache can be tested offline (no Hub, no network)."""

from __future__ import annotations

import shutil
from pathlib import Path

REVISION = "0" * 40


def put_in_hub_cache(source: Path, repo_id: str, repo_type: str, cache: str | None = None) -> str:
    """Copy `source` as the `main` snapshot of `repo_id` into `cache` (default: this process's
    huggingface_hub cache); returns `repo_id`."""
    if cache is None:
        from huggingface_hub import constants

        cache = constants.HF_HUB_CACHE
    repo = Path(cache) / f"{repo_type}s--{repo_id.replace('/', '--')}"
    shutil.copytree(source, repo / "snapshots" / REVISION)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(REVISION)
    return repo_id
