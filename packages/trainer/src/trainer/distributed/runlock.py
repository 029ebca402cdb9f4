"""One writer per run directory: a lock file in `--output_dir`, and ranks that stop when their launcher dies.

Two jobs writing one `--output_dir` interleave their checkpoints and metrics without a word: a user's
second launch, a requeued job whose predecessor still runs, and the workers a `kill -9`'d torchrun leaves
behind (each rank lives in a session of its own) all look the same. The main rank therefore holds
`<output_dir>/trainer.lock` (owner host, pid, start time, a heartbeat rewritten every `HEARTBEAT_S`) for
the whole run. Another run finding it refuses to start and names the holder; a lock whose owner is dead on
this host, or whose heartbeat is older than `STALE_AFTER_S` (an owner on another host), is stale and taken
over with a warning. Creation is exclusive, so of two runs starting together exactly one wins: O_EXCL on a
local (or shared POSIX) directory, a conditional write (`If-None-Match: *`) in an s3:// bucket. Other
fsspec URLs have no exclusive create: such an output_dir is not locked, and the run says so at start.
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

from ckpt_tools import layout
from trainer.errors import ConfigError

LOCK_FILE = "trainer.lock"
HEARTBEAT_S = 10.0
STALE_AFTER_S = 120.0
PARENT_POLL_S = 1.0
BUCKET_PROTOCOLS = ("s3", "s3a")  # fsspec stores whose writes can be conditional (exclusive create)


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


class _LocalStore:
    """The lock file on a local (or shared POSIX) filesystem: O_EXCL creates it, renames replace it."""

    def __init__(self, path: str) -> None:
        self.path = path

    def create(self, text: str) -> bool:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        return True

    def read(self) -> tuple[str | None, Any]:
        try:
            with open(self.path, encoding="utf-8") as handle:
                return handle.read(), None
        except OSError:
            return None, None

    def replace(self, text: str, version: Any) -> bool:
        self.write(text)
        return True

    def write(self, text: str) -> None:
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, self.path)

    def remove(self) -> None:
        os.remove(self.path)


class _BucketStore:
    """The lock object in an S3 bucket. S3 has no O_EXCL, but conditional writes: a put with
    `If-None-Match: *` creates the object only if it does not exist, one with `If-Match: <ETag>` replaces
    only the version that was read. Best effort: a store that ignores these headers locks nothing."""

    def __init__(self, url: str) -> None:
        from trainer.reporting.run_files import resolve

        self.fs, self.path = resolve(url)

    def create(self, text: str) -> bool:
        try:
            self.fs.pipe_file(self.path, text.encode(), mode="create")
        except FileExistsError:
            return False
        return True

    def read(self) -> tuple[str | None, Any]:
        try:
            version = self.fs.info(self.path).get("ETag")
            return self.fs.cat_file(self.path).decode(), version
        except (OSError, UnicodeDecodeError):
            return None, None

    def replace(self, text: str, version: Any) -> bool:
        if version is None:  # vanished (or unreadable) since it was read: take it as new
            return self.create(text)
        try:
            self.fs.pipe_file(self.path, text.encode(), IfMatch=version)
        except OSError:  # PreconditionFailed: another run replaced it first
            return False
        return True

    def write(self, text: str) -> None:
        self.fs.pipe_file(self.path, text.encode())

    def remove(self) -> None:
        self.fs.rm_file(self.path)


def _store(path: str) -> _LocalStore | _BucketStore | None:
    """Where the lock file `path` lives; None for a URL whose store offers no exclusive create."""
    if not layout.is_url(path):
        return _LocalStore(path)
    if path.split("://", 1)[0] in BUCKET_PROTOCOLS:
        return _BucketStore(path)
    return None


class RunLock:
    """The lock a run holds on its output_dir; `acquire` on the main rank only, `release` at the end."""

    def __init__(self, output_dir: str) -> None:
        remote = layout.is_url(output_dir)
        self.output_dir = output_dir.rstrip("/") if remote else os.path.abspath(output_dir)
        self.path = f"{self.output_dir}/{LOCK_FILE}" if remote else os.path.join(self.output_dir, LOCK_FILE)
        self.store = _store(self.path)
        self.owner: Owner | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> str:
        """Take the lock, or raise `ConfigError` naming its live holder. Returns a warning line when a
        stale lock was taken over, or when this output_dir cannot be locked ("" otherwise)."""
        if self.store is None:
            return (
                f"warning: --output_dir={self.output_dir} is not locked against a second run (only local "
                "directories and s3:// buckets are): make sure no other run writes to it"
            )
        now = time.time()
        me = Owner(socket.gethostname(), os.getpid(), now, now)
        warning = ""
        if not self.store.create(_encode(me)):
            text, version = self.store.read()
            holder = _decode(text)
            if holder is not None and not holder.is_stale(now):
                raise self._held_by(holder, now)
            if not self.store.replace(_encode(me), version):
                holder = _decode(self.store.read()[0])
                raise self._held_by(holder, now)
            warning = (
                f"warning: took over the stale lock {self.path} of "
                f"{holder.describe(now) if holder else 'an unreadable owner'}"
            )
        self.owner = me
        self._thread = threading.Thread(target=self._beat, name="trainer-run-lock", daemon=True)
        self._thread.start()
        return warning

    def release(self) -> None:
        """Stop the heartbeat and remove the lock if this process still holds it."""
        if self.owner is None or self.store is None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        holder = _decode(self.store.read()[0])
        if holder is not None and (holder.host, holder.pid) == (self.owner.host, self.owner.pid):
            with contextlib.suppress(OSError):
                self.store.remove()
        self.owner = None

    def _held_by(self, holder: Owner | None, now: float) -> ConfigError:
        who = holder.describe(now) if holder else "an owner that just took it"
        return ConfigError(
            f"--output_dir={self.output_dir} is in use by another run: "
            f"{who}; wait for it to end or stop it, or choose another --output_dir"
        )

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            assert self.owner is not None and self.store is not None
            self.owner = Owner(self.owner.host, self.owner.pid, self.owner.started, time.time())
            with contextlib.suppress(OSError):  # a full disk must not end the run: the lock looks older
                self.store.write(_encode(self.owner))


def _encode(owner: Owner) -> str:
    return json.dumps(asdict(owner)) + "\n"


def _decode(text: str | None) -> Owner | None:
    if text is None:
        return None
    try:
        data: dict[str, Any] = json.loads(text)
        return Owner(str(data["host"]), int(data["pid"]), float(data["started"]), float(data["heartbeat"]))
    except (ValueError, KeyError, TypeError):
        return None


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
