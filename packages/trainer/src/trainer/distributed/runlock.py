"""One writer per run directory: a lock file in `--output_dir`, and ranks that stop when their launcher dies.

Two jobs writing one `--output_dir` interleave their checkpoints and metrics without a word: a user's
second launch, a requeued job whose predecessor still runs, and the workers a `kill -9`'d torchrun leaves
behind (each rank lives in a session of its own) all look the same. The main rank therefore holds
`<output_dir>/trainer.lock` (owner host, pid, start time, a heartbeat rewritten every `HEARTBEAT_S`) for
the whole run. Another run finding it refuses to start and names the holder; a lock whose owner is dead on
this host, or whose heartbeat is older than `STALE_AFTER_S` (an owner on another host), is stale and taken
over with a warning. A live pid on this host is never stale, however old its heartbeat (a stopped or
swapping process still owns its run). Creation is exclusive, so of two runs starting together exactly one
wins: O_EXCL on a local (or shared POSIX) directory, a conditional write (`If-None-Match: *`) in an s3://
bucket. Replacing the lock (a takeover, and every heartbeat) is exclusive too: on local disk whoever
replaces the text T first creates the claim file `trainer.lock.claim-<hash of T>` with O_EXCL, then checks
that the lock still holds T, then renames its own text over it; in a bucket the write is conditional on
the version read (`If-Match`). So of two racing takeovers exactly one wins, and an owner whose lock was
taken over learns it at its next heartbeat (`RunLock.check` then stops the run before its next commit).
Other fsspec URLs have no exclusive create: such an output_dir is not locked, and the run says so at start.
The window that remains (docs/resume.md): an owner on another host that is alive but silent for longer
than `STALE_AFTER_S` (or whose clock is that far off) can be taken over; it stops at its next heartbeat,
and may finish one commit that had already started.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from ckpt_tools import layout, storage
from trainer.errors import ConfigError, RunFailedError

LOCK_FILE = "trainer.lock"
HEARTBEAT_S = 10.0
STALE_AFTER_S = 120.0
PARENT_POLL_S = 1.0
MAX_LOCK_BYTES = 4096
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
        """Dead on this host (a live pid here never is, whatever its heartbeat says: the process may
        only be stopped), or silent for longer than STALE_AFTER_S (another host's owner)."""
        if self.host == socket.gethostname():
            return not _alive(self.pid)
        return now - self.heartbeat > STALE_AFTER_S


class _LocalStore:
    """The lock file on a local (or shared POSIX) filesystem: O_EXCL creates it; a replacement is
    exclusive through a claim file created with O_EXCL before the lock is checked and renamed over."""

    def __init__(self, path: str) -> None:
        self.path = path

    def create(self, text: str) -> bool:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        return _create_exclusive(self.path, text)

    def read(self) -> tuple[str | None, Any]:
        """The lock's text; its version is the text itself (what a replacement must still find)."""
        text = _read_small(self.path)
        return text, text

    def replace(self, text: str, version: Any) -> bool:
        """Put `text` in place of the lock only if it still holds `version`: create-then-verify, so of
        two processes replacing the same text exactly one succeeds. A claim left by a claimer that died
        is itself stale, and is taken over the same way (one level down)."""
        if version is None:  # vanished (or unreadable) since it was read: take it as new
            return self.create(text)
        claim = f"{self.path}.claim-{hashlib.sha256(version.encode()).hexdigest()[:16]}"
        if not _create_exclusive(claim, text):
            claimer = _read_small(claim)
            owner = _decode(claimer)
            if claimer is None or (owner is not None and not owner.is_stale(time.time())):
                return False  # a live process is replacing this version now
            if not _LocalStore(claim).replace(text, claimer):
                return False
        try:
            if _read_small(self.path) != version:
                return False
            self.write(text)
            return True
        finally:
            with contextlib.suppress(OSError):
                os.remove(claim)

    def write(self, text: str) -> None:
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, self.path)

    def remove(self) -> None:
        os.remove(self.path)


def _create_exclusive(path: str, text: str) -> bool:
    """Create `path` holding `text` unless it exists: written under a private name, then hard-linked
    to `path` (the link fails if `path` exists), so it appears complete: a reader never sees a claim
    half written and takes it for an unreadable, stale one. O_EXCL where links are not supported."""
    tmp = f"{path}.{socket.gethostname()}.{os.getpid()}.{threading.get_ident()}.new"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    except OSError:  # no hard links here (some network filesystems)
        return _create_excl_open(path, text)
    finally:
        os.remove(tmp)


def _create_excl_open(path: str, text: str) -> bool:
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    return True


def _read_small(path: str) -> str | None:
    """A lock or claim file's text (a few hundred bytes; more, or not text, reads as unreadable)."""
    try:
        with open(path, "rb") as handle:
            return handle.read(MAX_LOCK_BYTES + 1).decode("utf-8") if os.path.isfile(path) else None
    except (OSError, UnicodeDecodeError):
        return None


class _BucketStore:
    """The lock object in an S3 bucket. S3 has no O_EXCL, but conditional writes: a put with
    `If-None-Match: *` creates the object only if it does not exist, one with `If-Match: <ETag>` replaces
    only the version that was read. Best effort: a store that ignores these headers locks nothing."""

    def __init__(self, url: str) -> None:
        self.fs, self.path = storage.resolve(url)

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
        self.lost: str | None = None  # the line `check` raises once another run holds the lock
        self._text: str | None = None  # what this run last wrote to the lock
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
        self.owner, self._text = me, _encode(me)
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

    def check(self) -> None:
        """Raise `ConfigError` when a heartbeat found the lock in another run's hands: the main rank
        calls it before each commit, so a run that lost its directory writes no further step there."""
        if self.lost is not None:
            raise RunFailedError(self.lost)

    def beat(self) -> None:
        """One heartbeat: rewrite the lock only if it still holds what this run last wrote, through the
        store's exclusive replace. A lock naming someone else sets `lost` and ends the heartbeat."""
        assert self.owner is not None and self.store is not None
        text, version = self.store.read()
        if text == self._text:
            fresh = Owner(self.owner.host, self.owner.pid, self.owner.started, time.time())
            try:
                if self.store.replace(_encode(fresh), version):
                    self.owner, self._text = fresh, _encode(fresh)
                    return
            except OSError:  # a full disk must not end the run: the lock only looks older
                return
            text = self.store.read()[0]
            if text == self._text:
                return  # another process is replacing it right now: the next beat sees who won
        holder = _decode(text)
        who = holder.describe(time.time()) if holder is not None else "an unreadable or missing lock"
        self.lost = (
            f"--output_dir={self.output_dir} was taken over by another run ({who}): this run stops "
            "before its next commit; the checkpoints it committed stay. Run one job per --output_dir"
        )
        self._stop.set()

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            self.beat()


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
