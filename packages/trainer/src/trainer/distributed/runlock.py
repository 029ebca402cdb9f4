"""One writer per run directory: a lock file in `--output_dir`, and ranks that stop when their launcher dies.

Two jobs writing one `--output_dir` interleave their checkpoints and metrics without a word: a user's
second launch, a requeued job whose predecessor still runs, and the workers a `kill -9`'d torchrun leaves
behind (each rank lives in a session of its own) all look the same. The main rank therefore holds
`<output_dir>/trainer.lock` (owner host, pid, start time, a heartbeat rewritten every `HEARTBEAT_S`) for
the whole run. Another run finding it refuses to start and names the holder; a lock whose owner is dead on
this host, or whose heartbeat is older than `STALE_AFTER_S` (an owner on another host), is stale and taken
over with a warning. Creation uses O_EXCL, so of two runs starting together exactly one wins.

Only local (and shared POSIX) directories are locked; an fsspec URL output_dir is not.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from trainer.errors import ConfigError

LOCK_FILE = "trainer.lock"
HEARTBEAT_S = 10.0
STALE_AFTER_S = 120.0
PARENT_POLL_S = 1.0


@dataclass(frozen=True)
class Owner:
    """Who holds a run directory."""

    host: str
    pid: int
    started: float
    heartbeat: float

    def describe(self, now: float) -> str:
        start = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.started))
        return (
            f"host {self.host} pid {self.pid} (started {start}, heartbeat {now - self.heartbeat:.0f} s ago)"
        )

    def is_stale(self, now: float) -> bool:
        """Dead on this host, or silent for longer than STALE_AFTER_S (another host's owner)."""
        if self.host == socket.gethostname() and not _alive(self.pid):
            return True
        return now - self.heartbeat > STALE_AFTER_S


class RunLock:
    """The lock a run holds on its output_dir; `acquire` on the main rank only, `release` at the end."""

    def __init__(self, output_dir: str) -> None:
        self.remote = "://" in output_dir  # a bucket has no O_EXCL create: not locked (see the docstring)
        self.path = os.path.join(os.path.abspath(output_dir), LOCK_FILE)
        self.owner: Owner | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> str:
        """Take the lock, or raise `ConfigError` naming its live holder. Returns a warning line when a
        stale lock was taken over ("" otherwise)."""
        if self.remote:
            return ""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        now = time.time()
        me = Owner(socket.gethostname(), os.getpid(), now, now)
        warning = ""
        if not self._create(me):
            holder = self._read()
            if holder is not None and not holder.is_stale(now):
                raise ConfigError(
                    f"--output_dir={os.path.dirname(self.path)} is in use by another run: "
                    f"{holder.describe(now)}; wait for it to end or stop it, or choose another --output_dir"
                )
            warning = (
                f"warning: took over the stale lock {self.path} of "
                f"{holder.describe(now) if holder else 'an unreadable owner'}"
            )
            os.replace(self._write_tmp(me), self.path)
        self.owner = me
        self._thread = threading.Thread(target=self._beat, name="trainer-run-lock", daemon=True)
        self._thread.start()
        return warning

    def release(self) -> None:
        """Stop the heartbeat and remove the lock if this process still holds it."""
        if self.owner is None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        holder = self._read()
        if holder is not None and (holder.host, holder.pid) == (self.owner.host, self.owner.pid):
            os.remove(self.path)
        self.owner = None

    def _create(self, me: Owner) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(asdict(me)) + "\n")
        return True

    def _read(self) -> Owner | None:
        try:
            with open(self.path, encoding="utf-8") as handle:
                data: dict[str, Any] = json.load(handle)
            return Owner(
                str(data["host"]), int(data["pid"]), float(data["started"]), float(data["heartbeat"])
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _write_tmp(self, owner: Owner) -> str:
        tmp = f"{self.path}.{owner.pid}.tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(asdict(owner)) + "\n")
        return tmp

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            assert self.owner is not None
            self.owner = Owner(self.owner.host, self.owner.pid, self.owner.started, time.time())
            with contextlib.suppress(OSError):  # a full disk must not end the run: the lock looks older
                os.replace(self._write_tmp(self.owner), self.path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def watch_launcher(on_death: Any) -> None:
    """Under a launcher (torchrun, accelerate launch: LOCAL_RANK is set), call `on_death(parent_pid)`
    once from a daemon thread when the launcher process dies: the rank has then been re-parented. A
    plain process is left alone (a `nohup` run outliving its shell is intended)."""
    if "LOCAL_RANK" not in os.environ:
        return
    parent = os.getppid()

    def poll() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        on_death(parent)

    threading.Thread(target=poll, name="trainer-launcher-watch", daemon=True).start()
