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

from trainer.distributed import runlock
from trainer.distributed.runlock import LOCK_FILE, STALE_AFTER_S, RunLock
from trainer.errors import ConfigError


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
        deadline = time.monotonic() + 10
        while json.loads((tmp_path / LOCK_FILE).read_text())["heartbeat"] == first:
            assert time.monotonic() < deadline, "the heartbeat never moved"
            time.sleep(0.02)
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
