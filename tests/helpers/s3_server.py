"""A real S3-compatible server on loopback for the object-storage tests: moto's standalone server.

It runs as its own process (`python -m moto.server`), so torchrun ranks, CLI subprocesses and the
test process all reach the same buckets over HTTP, through s3fs, exactly as against a cloud store.
The credentials are random per session: the tests grep every written file for the secret.
"""

from __future__ import annotations

import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass


@dataclass
class S3Server:
    """A running server and the environment a client needs to reach it (the usual AWS variables)."""

    process: subprocess.Popen[bytes]
    endpoint: str
    secret: str

    @property
    def env(self) -> dict[str, str]:
        return {
            "AWS_ACCESS_KEY_ID": "ckpt-tests",
            "AWS_SECRET_ACCESS_KEY": self.secret,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_s3_server(timeout: float = 60) -> S3Server:
    """Start moto's server on a free 127.0.0.1 port and wait until it answers."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = S3Server(process, f"http://127.0.0.1:{port}", secrets.token_hex(20))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"moto.server exited with {process.returncode} before answering")
        try:
            with urllib.request.urlopen(f"{server.endpoint}/moto-api/", timeout=2):
                return server
        except OSError:
            time.sleep(0.2)
    server.stop()
    raise RuntimeError(f"moto.server did not answer on {server.endpoint} within {timeout} s")
