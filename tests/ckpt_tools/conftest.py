"""Fixtures shared by the ckpt_tools tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from helpers.hub_server import HubServer


@pytest.fixture
def hub() -> Iterator[HubServer]:
    """A Hub-compatible server on 127.0.0.1 (random port) for the real huggingface_hub client."""
    with HubServer() as server:
        yield server
