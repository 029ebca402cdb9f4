"""Fault tolerance with real processes (gloo on CPU, docs/fault_tolerance.md): torchft's Lighthouse as
`trainer lighthouse` starts it, and replica groups of `trainer train` under torchrun meeting on it.

Every wait is for a state (a line printed, a process exited), bounded; every process started here is
stopped by the fixture that started it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
import torch

import ckpt_tools
from helpers.fault_tolerance import (
    TINY,
    TRAINER,
    final_weights,
    finish,
    finished_digests,
    group_flags,
    lighthouse,
    logged_step,
    quorum_records,
    records,
    start_group,
    train_losses,
)
from helpers.launch import CKPT_CLI, launch_env, run_torchrun
from helpers.waiting import wait_for

pytestmark = pytest.mark.distributed

SCRIPT = Path(__file__).parent / "scripts" / "train_cli.py"
OPS_SCRIPT = Path(__file__).parent / "scripts" / "ops_train.py"


def test_trainer_lighthouse_serves_quorums_until_sigterm() -> None:
    """The command prints an address a torchft client forms a quorum at, and SIGTERM stops it (exit 0)."""
    from torchft._torchft import LighthouseClient

    with lighthouse(1) as (process, address):
        client = LighthouseClient(address, connect_timeout=timedelta(seconds=30))
        quorum = client.quorum(replica_id="probe", timeout=timedelta(seconds=30), step=3, world_size=1)
        assert [(member.replica_id, member.step) for member in quorum.participants] == [("probe", 3)]
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0


def test_trainer_lighthouse_refuses_a_bad_flag_in_one_line() -> None:
    result = subprocess.run(
        [TRAINER, "lighthouse", "--min_replicas=0"],
        env={**os.environ},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stderr.strip() == "error: --min_replicas must be a whole number >= 1, got '0'"


@pytest.fixture(scope="module")
def two_groups(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two replica groups of one process each sharing an output_dir (ft/) and meeting on a Lighthouse
    that waits for both, without a failure; and the same run as plain 2-rank DDP (ddp/)."""
    root = tmp_path_factory.mktemp("ft_two_groups")
    cache = f"--dataset.cache_dir={root / 'cache'}"
    run_torchrun(SCRIPT, 2, *TINY, cache, f"--output_dir={root / 'ddp'}", timeout=240)
    with lighthouse(2) as (_, address):
        groups = [
            start_group(
                root / f"group{r}.log", *TINY, cache, f"--output_dir={root / 'ft'}", *group_flags(address, r)
            )
            for r in (0, 1)
        ]
        codes = finish(groups, timeout=240)
    logs = "\n".join((root / f"group{r}.log").read_text() for r in (0, 1))
    assert codes == [0, 0], logs
    return root


def test_two_groups_train_as_plain_ddp_does(two_groups: Path) -> None:
    """The gradients are averaged over the groups and each reads its replica id's share of the data:
    the weights equal 2-rank DDP's (group 0's checkpoint; group 1's digest is group 0's), and the
    groups' mean loss is DDP's loss at every step."""
    ft, ddp = final_weights(two_groups / "ft"), final_weights(two_groups / "ddp")
    assert ft.keys() == ddp.keys() and all(torch.equal(ft[name], ddp[name]) for name in ft)  # bit for bit
    digests = finished_digests(two_groups / "ft", 2)
    assert digests[0] == digests[1] and [step for step, _ in digests[0]] == [4]
    per_group = [train_losses(two_groups / "ft" / f"replica_{r}") for r in (0, 1)]
    assert len(per_group[0]) == 4
    mean = [(a + b) / 2 for a, b in zip(*per_group, strict=True)]
    assert mean == pytest.approx(train_losses(two_groups / "ddp"))
    assert per_group[0] != per_group[1]  # each group read its own half of every global batch
    step = ckpt_tools.read_training_step(str(two_groups / "ft" / "checkpoints" / "000004"))
    assert (step.sampler.epoch, step.sampler.offset) == (0, 4 * 8 * 2)  # the global order, both groups' share


def test_the_quorum_is_recorded_in_metrics(two_groups: Path) -> None:
    """The membership is logged once, at the first step: both groups, each with its rank in the quorum."""
    changes = [
        [r for r in records(two_groups / "ft" / f"replica_{g}") if r.get("event") == "quorum"] for g in (0, 1)
    ]
    assert [[(q["step"], q["replicas"], q["replica_rank"]) for q in group] for group in changes] == [
        [(1, 2, 0)],
        [(1, 2, 1)],
    ]


HEAL_STEPS = 2100


@pytest.fixture(scope="module")
def late_joiner(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """Group 0 trains alone (the Lighthouse forms quorums of one); once it logged step 30 it is paused
    (SIGSTOP) and group 1 is launched into the same output_dir (--resume=true, as a restarted group
    is); group 0 goes on once group 1 holds its run lock, so group 1's first quorum finds it alive
    and group 1 heals from it. The Lighthouse's long heartbeat and join timeouts keep a paused group 0
    in the quorum. Returns the output_dir and both groups' logs."""
    root = tmp_path_factory.mktemp("ft_heal")
    out = root / "run"
    args = (
        *TINY,
        f"--dataset.cache_dir={root / 'cache'}",
        f"--steps={HEAL_STEPS}",
        "--log_freq=10",
        f"--save_freq={HEAL_STEPS // 3}",
        "--resume=true",
        f"--output_dir={out}",
    )
    with lighthouse(1, "--heartbeat_timeout_ms=120000", "--join_timeout_ms=120000") as (_, address):
        groups = [start_group(root / "group0.log", *args, *group_flags(address, 0))]
        try:
            wait_for(lambda: logged_step(out / "replica_0") >= 30, "group 0 at step 30", 180, groups)
            groups[0].send_signal(signal.SIGSTOP)
            groups.append(start_group(root / "group1.log", *args, *group_flags(address, 1)))
            wait_for(lambda: (out / "replica_1" / "trainer.lock").exists(), "group 1's lock", 120, groups[1:])
        finally:
            groups[0].send_signal(signal.SIGCONT)
            codes = finish(groups, timeout=300)
    logs = [(root / f"group{r}.log").read_text() for r in (0, 1)]
    assert codes == [0, 0], "\n".join(logs)
    return out, logs


def quorums(run_dir: Path) -> list[tuple[int, int]]:
    """(step, live groups) of each membership change a group logged."""
    return [(r["step"], r["replicas"]) for r in records(run_dir) if r.get("event") == "quorum"]


def test_a_group_that_joins_late_heals_from_its_peer_and_both_end_equal(late_joiner) -> None:
    """Group 0 trains alone, then its quorum grows to two when group 1 joins: group 1 takes group 0's
    state over at that step (model, optimizer, schedule, sampler, RNG; no checkpoint decides where it
    continues) and both finish at --steps with the same weights, bit for bit."""
    out, logs = late_joiner
    changes = quorums(out / "replica_0")
    assert changes[0] == (1, 1) and changes[-1][1] == 2, changes
    joined = changes[-1][0]
    assert 30 < joined < HEAL_STEPS, f"group 1 joined at step {joined}: the launch came too late"
    assert f"healed from a live replica group: continuing after its step {joined - 1}" in logs[1]
    assert quorums(out / "replica_1") == [(joined, 2)]
    digests = finished_digests(out, 2)
    assert digests[0] == digests[1] and [step for step, _ in digests[0]] == [HEAL_STEPS]


def test_only_the_lowest_live_replica_id_writes_checkpoints(late_joiner) -> None:
    """Group 0 (the lowest id, alive throughout) saves every checkpoint into the shared output_dir, in
    the usual format: `ckpt verify` passes on the last one; group 1 keeps its own lock and metrics."""
    out, logs = late_joiner
    saves = [[line for line in log.splitlines() if line.startswith("checkpoint ")] for log in logs]
    assert [len(group) for group in saves] == [3, 0]
    last = ckpt_tools.latest_step_dir(str(out))
    assert last is not None and last.endswith(f"{HEAL_STEPS:06d}")
    verified = subprocess.run([CKPT_CLI, "verify", last], capture_output=True, text=True, timeout=120)
    assert verified.returncode == 0, verified.stdout + verified.stderr


KILL_STEPS = 3000


def lock_pid(run_dir: Path) -> int | None:
    """The pid holding a group's run lock (None before any lock is written)."""
    lock = run_dir / "trainer.lock"
    return json.loads(lock.read_text())["pid"] if lock.exists() else None


def trained_together(run_dir: Path) -> int:
    """The steps a group's latest launch logged since its quorum last grew to two groups (-1 while it is
    not in one): the records of an earlier launch of the group, in the same metrics.jsonl, do not count."""
    found = records(run_dir) if (run_dir / "metrics.jsonl").exists() else []
    starts = [i for i, r in enumerate(found) if r.get("event") == "start"]
    latest = found[starts[-1] :] if starts else []
    changes = [r for r in latest if r.get("event") == "quorum"]
    if not changes or changes[-1]["replicas"] != 2:
        return -1
    steps = [r["step"] for r in latest if r.get("event") == "train"]
    return (steps[-1] if steps else 0) - changes[-1]["step"]


def start_ops_group(log: Path, hooks: list[str], *args: str) -> subprocess.Popen[str]:
    """One replica group run by the hook script (tests/distributed/scripts/ops_train.py), output to `log`."""
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, str(OPS_SCRIPT), *hooks, *args],
            env={**launch_env(), "RUST_LOG": "warn"},
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )


def relaunch_beside(
    pause: Path, run_dir: Path, relaunch: Callable[[], subprocess.Popen[str]]
) -> subprocess.Popen[str]:
    """Relaunch a group while its live peer is paused between two steps (`pause` exists: the peer's
    --hook-pause-while; its heartbeats go on), so that the peer cannot finish first; the peer goes on
    once the new group holds its run lock, before that group's first quorum, which finds the peer alive
    and in step: the new group heals from it."""
    pause.touch()
    try:
        group = relaunch()
        wait_for(lambda: lock_pid(run_dir) == group.pid, "the relaunched group's lock", 120, [group])
    finally:
        pause.unlink()
    return group


@dataclass
class KillRun:
    """What `killed_and_healed` saw: the output_dir, each launch's log (group 0; group 1's first launch,
    its launch killed mid-heal, its launch that healed), and the steps the groups had logged at the kills."""

    out: Path
    logs: list[str]
    killed_at: int
    """The last step group 1 logged before its SIGKILL."""
    heal_killed_at: int
    """Group 0's last logged step when group 1 was killed in the middle of healing."""


@pytest.fixture(scope="module")
def killed_and_healed(tmp_path_factory: pytest.TempPathFactory) -> KillRun:
    """One launch, two failures, each at a state waited for. Two replica groups train together (the
    Lighthouse's --min_replicas=1, so that one group can go on alone: the first to start trains alone
    until the other heals from it and joins).

    1. Once group 1 logged 20 steps in a quorum of both it is SIGKILLed. Group 0's exchange with it
       fails, the step is not committed, and once the Lighthouse stops hearing group 1
       (--heartbeat_timeout_ms) group 0 trains on alone.
    2. Once group 0 logged 30 steps alone, group 1 is relaunched as its launcher would (--resume=true,
       same flags) and joins; as its fetch of group 0's state begins (--hook-hold-heal) it is
       SIGKILLed again. Group 0's step with it is not committed either, and it trains on alone.
    3. Once group 0 logged 30 more steps, group 1 is relaunched once more, heals from group 0 and both
       finish together.
    """
    root = tmp_path_factory.mktemp("ft_kill")
    out = root / "run"
    args = (
        *TINY,
        f"--dataset.cache_dir={root / 'cache'}",
        f"--steps={KILL_STEPS}",
        "--log_freq=10",
        f"--save_freq={KILL_STEPS // 3}",
        "--resume=true",
        f"--output_dir={out}",
    )
    flags = ("--heartbeat_timeout_ms=2000", "--join_timeout_ms=1000")
    logs = [root / f"{name}.log" for name in ("group0", "group1", "group1_heal_killed", "group1_healed")]
    healing, pause = root / "healing", root / "pause"
    with lighthouse(1, *flags) as (_, address):
        groups = [
            start_ops_group(logs[0], [f"--hook-pause-while={pause}"], *args, *group_flags(address, 0)),
            start_group(logs[1], *args, *group_flags(address, 1)),
        ]
        try:
            wait_for(lambda: trained_together(out / "replica_1") >= 20, "20 steps together", 180, groups)
            killed_at = kill(groups[1], out / "replica_1")
            alone = logged_step(out / "replica_0")
            wait_for(lambda: logged_step(out / "replica_0") >= alone + 30, "group 0 alone", 120, groups[:1])
            groups[1] = relaunch_beside(
                pause,
                out / "replica_1",
                lambda: start_ops_group(
                    logs[2], [f"--hook-hold-heal={healing}"], *args, *group_flags(address, 1)
                ),
            )
            wait_for(healing.exists, "group 1 fetching group 0's state", 120, groups)
            kill(groups[1], out / "replica_1")
            heal_killed_at = logged_step(out / "replica_0")
            wait_for(
                lambda: logged_step(out / "replica_0") >= heal_killed_at + 30,
                "group 0 alone",
                120,
                groups[:1],
            )
            groups[1] = relaunch_beside(
                pause, out / "replica_1", lambda: start_group(logs[3], *args, *group_flags(address, 1))
            )
        finally:
            codes = finish(groups, timeout=300)
    texts = [log.read_text() for log in logs]
    assert codes == [0, 0], "\n".join(texts)
    return KillRun(out, texts, killed_at, heal_killed_at)


def kill(group: subprocess.Popen[str], run_dir: Path) -> int:
    """SIGKILL a group (no handler, no checkpoint, no goodbye to the Lighthouse); its last logged step."""
    group.kill()
    assert group.wait(timeout=30) == -signal.SIGKILL
    return logged_step(run_dir)


def test_a_killed_group_s_peer_trains_on_and_the_group_heals_from_it(killed_and_healed: KillRun) -> None:
    """After each SIGKILL group 0's quorum shrinks to itself and its step counter keeps advancing (its
    records between the shrink and the regrowth, timestamped), the second time after group 1 was killed
    in the middle of fetching its state (no record in group 1: it never trained); the relaunched group 1
    heals from it at the step group 0 is at, holding group 0's weights bit for bit as that step starts,
    and both finish at --steps with equal weights."""
    run = killed_and_healed
    survivor = quorum_records(run.out / "replica_0")
    # before them, at most the quorum of group 0 alone when it started first (group 1 then healed from it)
    membership = [(q["replicas"], q["replica_rank"]) for q in survivor]
    assert membership[-5:] == [(2, 0), (1, 0), (2, 0), (1, 0), (2, 0)], survivor
    assert len(survivor) == 5 or survivor[0]["replicas"] == 1
    _, alone, with_healer, alone_again, back = survivor[-5:]
    assert run.killed_at <= alone["step"] < with_healer["step"] < back["step"] < KILL_STEPS
    assert alone_again["step"] == with_healer["step"]  # the step with the killed healer: not committed, again
    for start, end in ((alone, with_healer), (alone_again, back)):
        trained_alone = [
            r["step"]
            for r in records(run.out / "replica_0")
            if r.get("event") == "train" and start["step"] <= r["step"] < end["step"]
        ]
        assert len(trained_alone) >= 3 and end["step"] - start["step"] >= 30  # it never waited for group 1
        assert start["time"] < end["time"]
    assert "hook: rank 0 holds its fetch of a peer's state" in run.logs[2]
    assert "healed from a live replica group" not in run.logs[2]
    assert f"healed from a live replica group: continuing after its step {back['step'] - 1}" in run.logs[3]
    healed = quorum_records(run.out / "replica_1")[-1]
    assert (healed["step"], healed["replicas"], healed["replica_rank"]) == (back["step"], 2, 1)
    assert healed["weights_sha256"] == back["weights_sha256"]  # the peer's weights, bit for bit
    digests = finished_digests(run.out, 2)
    assert digests[0] == digests[1] and [step for step, _ in digests[0]] == [KILL_STEPS]


def test_the_survivor_alone_saved_and_last_verifies(killed_and_healed: KillRun) -> None:
    """Group 0, the lowest live id throughout, wrote every checkpoint, in the usual format."""
    out, logs = killed_and_healed.out, killed_and_healed.logs
    saves = [[line for line in log.splitlines() if line.startswith("checkpoint ")] for log in logs]
    assert [len(group) for group in saves] == [3, 0, 0, 0]
    last = ckpt_tools.latest_step_dir(str(out))
    assert last is not None and last.endswith(f"{KILL_STEPS:06d}")
    verified = subprocess.run([CKPT_CLI, "verify", last], capture_output=True, text=True, timeout=120)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_the_lighthouse_killed_stops_the_groups_in_one_line_and_a_relaunch_resumes(tmp_path: Path) -> None:
    """The Lighthouse SIGKILLed under a training group (held between two steps meanwhile, so that its
    next quorum is asked of no Lighthouse): torchft 0.2.0's manager leaves a quorum the Lighthouse
    failed unanswered, so the group waits --fault_tolerance.quorum_timeout_s, then stops with one line
    naming the Lighthouse and the flag, exit 1, its `last` checkpoint valid. The Lighthouse started again
    on its port and the group relaunched with --resume=true, it resumes from `last` and finishes."""
    out, pause = tmp_path / "run", tmp_path / "pause"
    logs = [tmp_path / "group0.log", tmp_path / "group0_relaunched.log"]
    args = [*TINY, f"--dataset.cache_dir={tmp_path / 'cache'}", "--steps=200", "--log_freq=10"]
    args += ["--save_freq=20", "--resume=true", f"--output_dir={out}", "--fault_tolerance.quorum_timeout_s=2"]
    args += ["--fault_tolerance.process_group_timeout_ms=1000"]
    with lighthouse(1) as (process, address):
        flags = [*args, *group_flags(address, 0, group_size=1)]
        group = start_ops_group(logs[0], [f"--hook-pause-while={pause}"], *flags)
        try:
            wait_for(lambda: logged_step(out / "replica_0") >= 30, "step 30", 180, [group])
            pause.touch()
            process.kill()
            process.wait(timeout=30)
            pause.unlink()
        finally:
            codes = finish([group], timeout=120)
    lines = logs[0].read_text().splitlines()
    assert codes == [1], "\n".join(lines)
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: no quorum for step "), errors
    assert f"--fault_tolerance.quorum_timeout_s=2 (is the Lighthouse {address} up" in errors[0]
    last = ckpt_tools.latest_step_dir(str(out))
    assert last is not None and int(Path(last).name) < 200
    verified = subprocess.run([CKPT_CLI, "verify", last], capture_output=True, text=True, timeout=120)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    with lighthouse(1, bind=f"127.0.0.1:{address.rsplit(':', 1)[1]}"):
        codes = finish([start_ops_group(logs[1], [], *flags)], timeout=180)
    relaunched = logs[1].read_text()
    assert codes == [0], relaunched
    assert f"hook: rank 0 resumes from {last}" in relaunched
    assert str(ckpt_tools.latest_step_dir(str(out))).endswith("000200")


SAVE_KILLED = 200


def test_the_saving_group_killed_mid_save_leaves_last_valid_and_its_peer_saves_on(tmp_path: Path) -> None:
    """Group 0, the lowest live id and so the one saving, is SIGKILLed while it writes step 200's
    checkpoint (its commit held for a minute: the state waited for is the temporary step directory).
    `last` still names step 150 and verifies; group 1 never comes back to a peer: it trains on alone, is
    now the lowest live id, and writes the later checkpoints itself, up to --steps. Every step sleeps
    0.1 s so that the group that starts first trains alone for fewer than 200 steps before the other
    joins (checked)."""
    out, cache = tmp_path / "run", f"--dataset.cache_dir={tmp_path / 'cache'}"
    args = [*TINY, cache, "--steps=260", "--log_freq=10", "--save_freq=50"]
    args += ["--resume=true", f"--output_dir={out}"]
    hooks = [["--hook-step-sleep=0.1", f"--hook-slow-commit={SAVE_KILLED}:60"], ["--hook-step-sleep=0.1"]]
    logs = [tmp_path / f"group{r}.log" for r in (0, 1)]
    with lighthouse(1, "--heartbeat_timeout_ms=2000", "--join_timeout_ms=1000") as (_, address):
        groups = []
        for r in (0, 1):
            with logs[r].open("w") as log:
                groups.append(
                    subprocess.Popen(
                        [sys.executable, str(OPS_SCRIPT), *hooks[r], *args, *group_flags(address, r)],
                        env={**launch_env(), "RUST_LOG": "warn"},
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        text=True,
                    )
                )
        try:
            writing = out / "checkpoints" / f".tmp-{SAVE_KILLED:06d}"
            wait_for(writing.exists, f"group 0 writing step {SAVE_KILLED}", 180, groups)
            groups[0].kill()
            assert groups[0].wait(timeout=30) == -signal.SIGKILL
            # group 1 is still held at step 201's quorum, which waited for group 0 in its save
            last_then = ckpt_tools.latest_step_dir(str(out))
        finally:
            codes = finish(groups, timeout=240)
    texts = [log.read_text() for log in logs]
    assert codes[1] == 0, texts[1]
    joined = [q["step"] for q in quorum_records(out / "replica_1") if q["replicas"] == 2]
    assert joined and joined[0] < SAVE_KILLED, f"the groups met only at step {joined}: start-up too slow"
    assert [(q["replicas"], q["replica_rank"]) for q in quorum_records(out / "replica_1")][-1] == (1, 0)
    assert last_then is not None and last_then.endswith("000150")
    assert not (out / "checkpoints" / f"{SAVE_KILLED:06d}").exists()
    saved_by_1 = [line.split()[1] for line in texts[1].splitlines() if line.startswith("checkpoint ")]
    assert [Path(path).name for path in saved_by_1] == ["000250", "000260"]
    last = ckpt_tools.latest_step_dir(str(out))
    assert last is not None and last.endswith("000260")
    for step in ("000150", "000260"):
        verified = subprocess.run(
            [CKPT_CLI, "verify", str(out / "checkpoints" / step)], capture_output=True, text=True, timeout=120
        )
        assert verified.returncode == 0, verified.stdout + verified.stderr
