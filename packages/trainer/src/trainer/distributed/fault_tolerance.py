"""The replica groups' side of torchft: its Lighthouse (the `trainer lighthouse` command).

A fault-tolerant job is several replica groups (each one launch: one process, or FSDP2 over the
launch's ranks) and a Lighthouse (`serve_lighthouse`), which forms the quorum of the live groups at
every step. torchft is an optional dependency (`pip install 'ckpt-trainer[ft]'`), imported only here
and only when a run or the Lighthouse asks for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainer.errors import ConfigError

if TYPE_CHECKING:
    from torchft._torchft import LighthouseServer

INSTALL_HINT = "pip install 'ckpt-trainer[ft]' (torchft)"


def _require_torchft(what: str) -> None:
    """One line naming the extra when torchft is not installed."""
    try:
        import torchft  # noqa: F401
    except ImportError:
        raise ConfigError(f"{what} needs torchft, which is not installed: {INSTALL_HINT}") from None


def serve_lighthouse(
    bind: str, min_replicas: int, join_timeout_ms: int, quorum_tick_ms: int, heartbeat_timeout_ms: int
) -> LighthouseServer:
    """Start torchft's Lighthouse (its Rust server, in this process) on `bind` (host:port; port 0 picks
    a free one). It forms a quorum once `min_replicas` groups joined, or more when they join within
    `join_timeout_ms`, and drops a group whose heartbeats stop for `heartbeat_timeout_ms`."""
    _require_torchft("trainer lighthouse")
    from torchft._torchft import LighthouseServer

    return LighthouseServer(
        bind=bind,
        min_replicas=min_replicas,
        join_timeout_ms=join_timeout_ms,
        quorum_tick_ms=quorum_tick_ms,
        heartbeat_timeout_ms=heartbeat_timeout_ms,
    )
