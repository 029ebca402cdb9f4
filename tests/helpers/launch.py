"""Launch a multi-process job with torchrun from a test, the same way for every suite."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

# The installed `ckpt` command beside this interpreter, for tests that run the CLI as a user would.
CKPT_CLI = Path(sys.executable).with_name("ckpt")


def launch_env() -> dict[str, str]:
    """The environment of a launched job, read now: OMP_NUM_THREADS=1 keeps N processes on 2 cores
    from oversubscribing."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def no_traceback_from_us(log: str) -> bool:
    """torchrun may print its own failure summary; nothing of ours may show a Python traceback."""
    return "KeyboardInterrupt" not in log and "/trainer/" not in log and "/ckpt_tools/" not in log


def torchrun_command(
    script: str | os.PathLike[str], nproc: int, *args: str, torchrun_args: Sequence[str] = ()
) -> list[str]:
    """`torchrun --standalone --nproc-per-node=nproc script *args`, for tests that start it themselves.

    `--standalone` with `--rdzv-endpoint=localhost:0` lets the launcher bind a free port itself, so
    engineers running suites in parallel never collide."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--rdzv-endpoint=localhost:0",
        f"--nproc-per-node={nproc}",
        *torchrun_args,
        os.fspath(Path(script)),
        *args,
    ]


def run_torchrun(
    script: str | os.PathLike[str],
    nproc: int,
    *args: str,
    timeout: float = 240,
    check: bool = True,
    torchrun_args: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    """Run `torchrun_command(...)` and return the finished process. Asserts exit code 0 with the
    combined output in the message, so a failing rank's traceback shows in the test report;
    `check=False` returns a failed launch instead (crash tests).
    `torchrun_args` go to the launcher itself (e.g. `--max-restarts=1`).
    """
    result = subprocess.run(
        torchrun_command(script, nproc, *args, torchrun_args=torchrun_args),
        env=launch_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    assert not check or result.returncode == 0, (
        f"torchrun {script} ({nproc} procs) exited {result.returncode}:\n{result.stdout}"
    )
    return result


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now (the OS picks it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run_torchrun_nodes(
    script: str | os.PathLike[str], nnodes: int, nproc: int, *args: str, timeout: float = 240
) -> list[str]:
    """Launch `nnodes` torchrun agents on loopback, as separate machines would: each one
    `--nnodes=N --node-rank=i --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:PORT`, `nproc` workers each.

    Node 0 hosts the c10d rendezvous store (`is_host=1`), the others join it. Each agent writes to its
    own temporary file (a full pipe could stall one node while another waits for it in a collective).
    Waits for every agent, stops all of them with their workers when the timeout passes, and asserts
    that every agent exited 0. Returns each agent's combined output.
    """
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    endpoint = f"127.0.0.1:{free_port()}"
    with contextlib.ExitStack() as stack:
        logs = [stack.enter_context(tempfile.TemporaryFile("w+")) for _ in range(nnodes)]
        agents = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    f"--nnodes={nnodes}",
                    f"--node-rank={node}",
                    f"--nproc-per-node={nproc}",
                    "--rdzv-backend=c10d",
                    f"--rdzv-endpoint={endpoint}",
                    f"--rdzv-conf=is_host={int(node == 0)}",
                    "--local-addr=127.0.0.1",
                    os.fspath(Path(script)),
                    *args,
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            for node, log in enumerate(logs)
        ]
        deadline = time.monotonic() + timeout
        try:
            for agent in agents:
                agent.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            for agent in agents:  # SIGTERM first: the agent stops its workers (in sessions of their own)
                if agent.poll() is None:
                    agent.terminate()
                    try:
                        agent.wait(timeout=15)
                    except subprocess.TimeoutExpired:
                        os.killpg(agent.pid, signal.SIGKILL)
                        agent.wait()
            outputs = []
            for log in logs:
                log.seek(0)
                outputs.append(log.read())
    failed = [(node, agent.returncode) for node, agent in enumerate(agents) if agent.returncode != 0]
    assert not failed, f"torchrun agents (node, exit code) {failed} failed:\n" + "\n".join(outputs)
    return outputs
