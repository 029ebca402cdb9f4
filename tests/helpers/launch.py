"""Launch a multi-process job with torchrun from a test, the same way for every suite."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

# The installed `ckpt` command beside this interpreter, for tests that run the CLI as a user would.
CKPT_CLI = Path(sys.executable).with_name("ckpt")


def run_torchrun(
    script: str | os.PathLike[str],
    nproc: int,
    *args: str,
    timeout: float = 240,
    check: bool = True,
    torchrun_args: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    """Run `torchrun --standalone --nproc-per-node=nproc script *args` and return the finished process.

    `--standalone` with `--rdzv-endpoint=localhost:0` lets the launcher bind a free port itself, so
    engineers running suites in parallel never collide. OMP_NUM_THREADS=1 keeps N processes on 2 cores
    from oversubscribing. Asserts exit code 0 with the combined output in the message, so a failing
    rank's traceback shows in the test report; `check=False` returns a failed launch instead (crash tests).
    `torchrun_args` go to the launcher itself (e.g. `--max-restarts=1`).
    """
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    command = [
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
    result = subprocess.run(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout
    )
    assert not check or result.returncode == 0, (
        f"torchrun {script} ({nproc} procs) exited {result.returncode}:\n{result.stdout}"
    )
    return result
