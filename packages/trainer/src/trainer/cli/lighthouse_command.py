"""`trainer lighthouse [--bind=HOST:PORT] [--min_replicas=N] ...`: torchft's Lighthouse, which forms the
quorum of the live replica groups of a fault-tolerant run at every step (docs/fault_tolerance.md).

It prints its address (`lighthouse: http://host:port`, what `--fault_tolerance.lighthouse` or
`TORCHFT_LIGHTHOUSE` takes) once it listens, then serves until SIGTERM or SIGINT. torchft's own
`torchft_lighthouse` command starts the same server.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence

from trainer.distributed.fault_tolerance import serve_lighthouse
from trainer.errors import ConfigError

USAGE = (
    "usage: trainer lighthouse [--bind=[::]:29510] [--min_replicas=1] [--join_timeout_ms=10000] "
    "[--quorum_tick_ms=100] [--heartbeat_timeout_ms=5000]"
)
_DEFAULTS = {
    "bind": "[::]:29510",
    "min_replicas": "1",
    "join_timeout_ms": "10000",
    "quorum_tick_ms": "100",
    "heartbeat_timeout_ms": "5000",
}


def run(args: Sequence[str]) -> None:
    """Serve the Lighthouse until SIGTERM/SIGINT; its address on stdout first."""
    flags = dict(_DEFAULTS)
    for arg in args:
        name, equals, value = arg.removeprefix("--").partition("=")
        if not arg.startswith("--") or name not in _DEFAULTS or not equals:
            raise ConfigError(f"trainer lighthouse does not take {arg!r}: {USAGE.removeprefix('usage: ')}")
        flags[name] = value
    numbers = {name: _positive(name, flags[name]) for name in _DEFAULTS if name != "bind"}
    stop = (signal.SIGTERM, signal.SIGINT)
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)  # delivered to sigwait below, not as an exception
    server = serve_lighthouse(flags["bind"], **numbers)
    print(f"lighthouse: {server.address()}", flush=True)
    signal.sigwait(stop)
    server.shutdown()


def _positive(name: str, value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(f"--{name} must be a whole number >= 1, got {value!r}")
    return int(value)
