"""Elastic restarts without torchft: a node lost under `torchrun --nnodes=MIN:MAX --max-restarts=K`.

Two torchrun agents share a localhost c10d rendezvous, one worker each, as two machines would. Once a
step is committed, one agent is SIGKILLed with its worker (a lost node); the survivor's worker fails
on the broken collective, its agent restarts it on a world of 1, and the same command (`--resume=true
--global_batch_size=16`) resumes from `last` with the per-rank batch doubled: every step trains the
samples the 2-rank run would have (docs/resume.md, "Elastic restarts on fewer nodes").
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from helpers.launch import free_port, launch_env
from trainer.reporting.loss_curve import read_history

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(240)]

SCRIPT = Path(__file__).parent / "scripts" / "ops_train.py"
STEPS, HELD_AT = 6, 3  # saves every 2 steps: both ranks hold before step 3, step 2 committed


def flags(out: Path, cache: str) -> list[str]:
    return [
        f"--output_dir={out}",
        f"--dataset.cache_dir={cache}",
        "--dataset.episodes=4",
        "--dataset.eval_episodes=0",
        f"--steps={STEPS}",
        "--log_freq=1",
        "--save_freq=2",
        "--global_batch_size=16",
        "--policy.type=mlp",
        "--policy.hidden_dim=16",
        "--policy.dropout=0",  # deterministic: 2 ranks and one process train the same function
        "--collective_timeout_s=60",
        "--num_workers=0",
    ]


def agent(endpoint: str, host: bool, log, *args: str) -> subprocess.Popen[str]:
    """One node: a torchrun agent of the elastic rendezvous, in a process group of its own. The host
    holds the c10d store (the survivor must: the store dies with its agent); a dead peer is noticed
    after 3 missed 1 s keep-alives, and a round closes 2 s after its first node joined."""
    conf = f"is_host={int(host)},last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=3"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1:2",
        "--nproc-per-node=1",
        "--max-restarts=2",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-conf={conf}",
        "--local-addr=127.0.0.1",
        str(SCRIPT),
        *args,
    ]
    env = {**launch_env(), "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}  # docs/resume.md
    return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def held_ranks(hold: Path) -> dict[int, tuple[int, int, int]]:
    """The ranks waiting before step HELD_AT: rank -> (pid, its agent's pid, world size)."""
    found = {}
    for marker in hold.glob("rank[0-9]"):
        pid, parent, world = (int(part) for part in marker.read_text().split())
        found[int(marker.name[4:])] = (pid, parent, world)
    return found


def wait_for(what: str, ready, agents: list[subprocess.Popen[str]], logs, timeout: float = 150) -> None:
    """Poll `ready()` until true; fail at once, with the logs, when an agent ends first."""
    deadline = time.monotonic() + timeout
    while not ready():
        ended = [a for a in agents if a.poll() is not None]
        if ended or time.monotonic() > deadline:
            text = "\n".join(read(log) for log in logs)
            pytest.fail(f"waiting for {what}: {'an agent exited' if ended else 'timed out'}\n{text}")
        time.sleep(0.1)


def read(log) -> str:
    log.seek(0)
    return log.read()


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def step_losses(out: Path) -> dict[int, float]:
    """Each step's loss (the mean over ranks) as the loss curve reads them: across the resume."""
    return dict(read_history(out / "metrics.jsonl").step_loss)


def training_step(out: Path) -> dict:
    step_dir = out / "checkpoints" / os.readlink(out / "checkpoints" / "last")
    return json.loads((step_dir / "training_state" / "training_step.json").read_text())


def test_lost_node_resumes_on_the_survivor_with_the_global_batch(tmp_path, tmp_path_factory):
    cache = str(tmp_path_factory.mktemp("elastic-cache"))
    out, hold = tmp_path / "elastic", tmp_path / "hold"
    hold.mkdir()
    args = [*flags(out, cache), "--resume=true", f"--hook-hold-step={HELD_AT}:{hold}"]
    endpoint = f"127.0.0.1:{free_port()}"
    with contextlib.ExitStack() as stack:
        logs = [stack.enter_context(tempfile.TemporaryFile("w+")) for _ in range(2)]
        survivor = agent(endpoint, True, logs[0], *args)
        lost = agent(endpoint, False, logs[1], *args)
        agents = [survivor, lost]
        try:
            wait_for(
                f"both ranks of a world of 2 held before step {HELD_AT}, step 2 committed",
                lambda: (
                    {r: w for r, (_, _, w) in held_ranks(hold).items()} == {0: 2, 1: 2}
                    and (out / "checkpoints" / "last").is_symlink()
                ),
                agents,
                logs,
            )
            lost_worker = next(pid for pid, parent, _ in held_ranks(hold).values() if parent == lost.pid)
            os.killpg(lost.pid, signal.SIGKILL)  # the node: its agent, and the worker in its own session
            os.kill(lost_worker, signal.SIGKILL)
            lost.wait(timeout=30)
            (hold / "release").touch()
            survivor.wait(timeout=150)
        finally:
            for process in agents:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)
        log = read(logs[0])
    assert survivor.returncode == 0, log

    resumes = [r for r in records(out) if r.get("event") == "resume" and r.get("step")]
    assert len(resumes) == 1, log
    assert resumes[0]["step"] == 2 and resumes[0]["sample_exact"] is True, resumes
    assert resumes[0]["batch"] == {
        "saved": {"batch_size": 8, "dp_world_size": 2, "global_batch_size": 16, "grad_accum_steps": 1},
        "now": {"batch_size": 16, "dp_world_size": 1, "global_batch_size": 16, "grad_accum_steps": 1},
    }, resumes
    assert "batch_size 8 -> 16" in resumes[0]["changes"], resumes
    assert "data order is unchanged" in log, log
    elastic = training_step(out)
    assert elastic["step"] == STEPS and elastic["dp_world_size"] == 1, elastic

    # The same command uninterrupted on one process: the same samples at every step, so the same
    # losses, sampler position and weights, to the order of fp32 additions.
    reference = tmp_path / "reference"
    straight = subprocess.run(
        [sys.executable, str(SCRIPT), *flags(reference, cache)],
        env=launch_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
    )
    assert straight.returncode == 0, straight.stdout
    expected, got = step_losses(reference), step_losses(out)
    assert sorted(got) == list(range(1, STEPS + 1)) == sorted(expected), (got, expected)
    assert got == pytest.approx(expected, rel=1e-5), (got, expected)
    assert elastic["sampler"] == training_step(reference)["sampler"]
    weights = [
        load_file(run / "checkpoints" / f"{STEPS:06d}" / "pretrained_model" / "model.safetensors")
        for run in (out, reference)
    ]
    assert weights[0].keys() == weights[1].keys()
    for name, tensor in weights[0].items():
        assert tensor.allclose(weights[1][name], rtol=1e-5, atol=1e-6), name
