"""Fixtures shared by the ckpt_tools tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch.distributed as dist

from helpers.hub_server import HubServer


@pytest.fixture
def hub() -> Iterator[HubServer]:
    """A Hub-compatible server on 127.0.0.1 (random port) for the real huggingface_hub client."""
    with HubServer() as server:
        yield server


@pytest.fixture
def one_rank(tmp_path: Path) -> Iterator[None]:
    """A one-rank gloo process group in this process: enough for DTensor parameters and the save's
    collective paths (background groups included) without a launch."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
