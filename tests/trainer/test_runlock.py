"""The run lock of an output_dir (trainer/distributed/runlock.py): held, refused, stale, released."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

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
