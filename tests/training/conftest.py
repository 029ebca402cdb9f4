"""Fixtures for in-process trainer tests: a shared dataset cache, and no leaked accelerate state."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def dataset_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("dataset_cache"))


@pytest.fixture
def clean_accelerate(monkeypatch: pytest.MonkeyPatch):
    """Each in-process run builds its own Accelerator: reset accelerate's singletons around it and
    restore os.environ (accelerate writes variables the env guard refuses)."""
    from accelerate.state import AcceleratorState

    for name in list(os.environ):
        if name.startswith(("ACCELERATE_", "FSDP_", "PARALLELISM_CONFIG_")) or name in ("WORLD_SIZE", "RANK"):
            monkeypatch.delenv(name)
    AcceleratorState._reset_state(reset_partial_state=True)
    saved = dict(os.environ)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    os.environ.clear()
    os.environ.update(saved)
