"""The run lock of an output_dir (trainer/distributed/runlock.py): held, refused, stale, released."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import fsspec
import pytest

from helpers.waiting import wait_for
from trainer.distributed import runlock
from trainer.distributed.runlock import LOCK_FILE, STALE_AFTER_S, RunLock
from trainer.errors import ConfigError, RunFailedError


def write_lock(out, host: str, pid: int, heartbeat: float) -> None:
    out.mkdir(parents=True, exist_ok=True)
    owner = {"host": host, "pid": pid, "started": heartbeat - 60, "heartbeat": heartbeat}
    (out / LOCK_FILE).write_text(json.dumps(owner))


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_held_lock_refuses_a_second_run_naming_the_holder(tmp_path):
    first = RunLock(str(tmp_path))
    assert first.acquire() == ""
    try:
        with pytest.raises(ConfigError) as refused:
            RunLock(str(tmp_path)).acquire()
        message = str(refused.value)
        assert message.startswith(
            f"--output_dir={tmp_path} is in use by another run: host {socket.gethostname()} "
        )
        assert f" pid {os.getpid()} (started " in message and "heartbeat 0 s ago" in message
    finally:
        first.release()
    assert not (tmp_path / LOCK_FILE).exists()
    second = RunLock(str(tmp_path))
    assert second.acquire() == ""  # free again once released
    second.release()


def test_a_dead_owner_on_this_host_is_taken_over_with_a_warning(tmp_path):
    pid = dead_pid()
    write_lock(tmp_path, socket.gethostname(), pid, time.time())  # fresh heartbeat, dead process
    lock = RunLock(str(tmp_path))
    warning = lock.acquire()
    try:
        assert warning.startswith(f"warning: took over the stale lock {tmp_path / LOCK_FILE} of host ")
        assert f"pid {pid} " in warning
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    finally:
        lock.release()


def test_another_host_is_stale_only_after_the_heartbeat_limit(tmp_path):
    write_lock(tmp_path, "node-elsewhere", 4242, time.time() - STALE_AFTER_S / 2)
    with pytest.raises(ConfigError, match="in use by another run: host node-elsewhere pid 4242"):
        RunLock(str(tmp_path)).acquire()
    write_lock(tmp_path, "node-elsewhere", 4242, time.time() - STALE_AFTER_S - 5)
    lock = RunLock(str(tmp_path))
    assert "took over the stale lock" in lock.acquire()
    lock.release()


def test_release_leaves_a_lock_that_another_run_took_over(tmp_path):
    lock = RunLock(str(tmp_path))
    lock.acquire()
    write_lock(tmp_path, "node-elsewhere", 4242, time.time())  # someone took it over meanwhile
    lock.release()
    assert json.loads((tmp_path / LOCK_FILE).read_text())["host"] == "node-elsewhere"


def test_the_heartbeat_is_refreshed_while_the_run_holds_the_lock(tmp_path, monkeypatch):
    monkeypatch.setattr(runlock, "HEARTBEAT_S", 0.05)
    lock = RunLock(str(tmp_path))
    lock.acquire()
    try:
        first = json.loads((tmp_path / LOCK_FILE).read_text())["heartbeat"]
        wait_for(
            lambda: json.loads((tmp_path / LOCK_FILE).read_text())["heartbeat"] != first,
            "move of the heartbeat",
        )
    finally:
        lock.release()


# ------------------------------------------------------------------------ an output_dir in a bucket


def bucket_lock(out: str) -> dict:
    return json.loads(fsspec.filesystem("s3", use_listings_cache=False).cat(f"{out}/{LOCK_FILE}"))


def test_a_bucket_output_dir_is_locked_although_s3_has_no_o_excl(s3_bucket):
    """The lock object is created with a conditional write (If-None-Match): a second run is refused."""
    out = f"{s3_bucket}/runs/a"
    first = RunLock(out)
    assert first.acquire() == ""
    try:
        with pytest.raises(ConfigError) as refused:
            RunLock(out).acquire()
        assert str(refused.value).startswith(f"--output_dir={out} is in use by another run: host ")
        assert bucket_lock(out)["started"] == first.owner.started  # not overwritten by the refused run
    finally:
        first.release()
    assert not fsspec.filesystem("s3", use_listings_cache=False).exists(f"{out}/{LOCK_FILE}")
    again = RunLock(out)
    assert again.acquire() == ""  # free again once released
    again.release()


def test_a_stale_bucket_lock_goes_to_one_of_two_runs_taking_it_over(s3_bucket):
    """Both runs read the same stale lock; the first replaces it (with the warning); the second's
    replacement is conditional on the version it read (If-Match), so it is refused naming the first."""
    out = f"{s3_bucket}/runs/b"
    stale = time.time() - STALE_AFTER_S - 5
    owner = {"host": "node-elsewhere", "pid": 4242, "started": stale - 60, "heartbeat": stale}
    fsspec.filesystem("s3").pipe(f"{out}/{LOCK_FILE}", json.dumps(owner).encode())
    first, second = RunLock(out), RunLock(out)
    read = second.store.read
    warnings = []

    def read_then_lose_the_race():
        seen = read()
        warnings.append(first.acquire())  # the other run takes the stale lock over meanwhile
        return seen

    second.store.read = read_then_lose_the_race
    try:
        with pytest.raises(ConfigError, match="in use by another run: host "):
            second.acquire()
        assert warnings[0].startswith(
            f"warning: took over the stale lock {out}/{LOCK_FILE} of host node-elsewhere"
        )
        assert bucket_lock(out)["started"] == first.owner.started
    finally:
        first.release()


def test_a_url_without_exclusive_create_is_not_locked_and_the_run_says_so():
    lock = RunLock("memory://runs/c")
    assert lock.acquire() == (
        "warning: --output_dir=memory://runs/c is not locked against a second run (only local "
        "directories and s3:// buckets are): make sure no other run writes to it"
    )
    lock.release()


# ----------------------------------------------------------------------- one owner, provably

_RACER = """
import sys
from trainer.distributed.runlock import RunLock
from trainer.errors import ConfigError, RunFailedError
for line in sys.stdin:
    try:
        warning = RunLock(line.strip()).acquire()  # held (not released) until the process ends
        print("won" if "took over" in warning else "won-fresh", flush=True)
    except ConfigError:
        print("refused", flush=True)
"""


def test_two_racing_takeovers_of_a_stale_lock_have_exactly_one_winner(tmp_path):
    """Two real processes take over the same stale lock (a dead pid on this host) at once, many
    times: each time exactly one wins and the lock names it. Without an exclusive takeover both won."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        for _ in range(2)
    ]
    pid = dead_pid()
    try:
        for trial in range(200):
            out = tmp_path / f"run{trial}"
            write_lock(out, socket.gethostname(), pid, time.time())
            for racer in racers:
                racer.stdin.write(f"{out}\n")
                racer.stdin.flush()
            results = sorted(racer.stdout.readline().strip() for racer in racers)
            assert results == ["refused", "won"], (trial, results)
            holder = json.loads((out / LOCK_FILE).read_text())["pid"]
            assert holder in {racer.pid for racer in racers}
            assert [p.name for p in out.iterdir()] == [LOCK_FILE]  # no claim file left behind
    finally:
        for racer in racers:
            racer.stdin.close()
            racer.wait(timeout=30)


def test_a_live_pid_on_this_host_is_never_stale_whatever_its_heartbeat(tmp_path):
    write_lock(tmp_path, socket.gethostname(), os.getpid(), time.time() - 10 * STALE_AFTER_S)
    with pytest.raises(ConfigError, match=f"in use by another run: host .* pid {os.getpid()} "):
        RunLock(str(tmp_path)).acquire()


def test_an_owner_whose_lock_was_taken_over_stops_before_its_next_commit(tmp_path, monkeypatch):
    """The heartbeat finds the lock naming another run: it leaves that lock as it is, and `check`
    (called before each commit) raises one line naming the new holder."""
    monkeypatch.setattr(runlock, "HEARTBEAT_S", 3600.0)  # beats driven by the test
    lock = RunLock(str(tmp_path))
    lock.acquire()
    try:
        lock.beat()
        lock.check()  # still ours
        write_lock(tmp_path, "node-elsewhere", 4242, time.time())
        lock.beat()
        assert json.loads((tmp_path / LOCK_FILE).read_text())["host"] == "node-elsewhere"
        with pytest.raises(RunFailedError) as lost:
            lock.check()
        message = str(lost.value)
        assert (
            "\n" not in message and "was taken over by another run (host node-elsewhere pid 4242" in message
        )
    finally:
        lock.release()


def test_a_claim_left_by_a_dead_claimer_does_not_block_the_takeover(tmp_path):
    """A process that died between its claim and its rename leaves the claim: it is stale in turn."""
    pid = dead_pid()
    write_lock(tmp_path, socket.gethostname(), pid, time.time())
    store = runlock._LocalStore(str(tmp_path / LOCK_FILE))
    _, version = store.read()
    claimer = {"host": socket.gethostname(), "pid": pid, "started": 0.0, "heartbeat": 0.0}
    assert runlock._create_exclusive(
        str(tmp_path / LOCK_FILE) + ".claim-" + _claim_hash(version), json.dumps(claimer)
    )
    lock = RunLock(str(tmp_path))
    assert "took over the stale lock" in lock.acquire()
    lock.release()
    assert list(tmp_path.iterdir()) == []


def _claim_hash(version: str) -> str:
    import hashlib

    return hashlib.sha256(version.encode()).hexdigest()[:16]


def test_the_loop_commits_nothing_once_the_lock_is_lost(
    tmp_path, dataset_cache, clean_accelerate, monkeypatch
):
    """Wired into the loop: a run whose heartbeat found another owner stops before its next commit
    (here the first), in one line, and commits no step."""
    from helpers.train_flags import tiny_args
    from trainer.cli.parse import parse_config
    from trainer.engine.plan import train

    acquire = RunLock.acquire

    def acquire_then_lose(self):
        warning = acquire(self)
        write_lock(tmp_path, "node-elsewhere", 4242, time.time())
        self.beat()
        return warning

    monkeypatch.setattr(RunLock, "acquire", acquire_then_lose)
    with pytest.raises(RunFailedError, match="was taken over by another run"):
        train(parse_config(tiny_args(str(tmp_path), dataset_cache, "--policy.type=mlp", "--steps=2")))
    assert not (tmp_path / "checkpoints" / "last").exists()
