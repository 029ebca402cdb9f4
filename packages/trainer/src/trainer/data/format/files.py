"""Where a dataset's files are: a local directory, or an fsspec URL read in place (`--dataset.streaming`).

The readers of `data/format/` take a `DatasetPath`: a `pathlib.Path` for a local dataset, a
`RemotePath` for a streamed one. `RemotePath` offers the few operations of `Path` they use (`/`,
`name`, `glob`, `is_file`, `read_text`), so one code path reads both; `source(path)` is what pyarrow
and PyAV open (the local path itself, memory-mapped by pyarrow, or a `remote.RemoteFile` reading
ranges of the object).

The store and its credentials resolve as a run's checkpoints on it do (`ckpt_tools.storage.resolve`:
fsspec with the store's own environment variables, `AWS_ENDPOINT_URL` and the AWS credentials for S3,
`HF_ENDPOINT` and `HF_TOKEN` (or `hf auth login`) for a Hub repo through huggingface_hub's
`HfFileSystem`: `hf://datasets/owner/name`, `@revision` after the name), so nothing secret is ever
part of a path. A store that does not answer, refuses us or lacks a file is
one `remote.StreamError` line naming the URL.
"""

from __future__ import annotations

import posixpath
from pathlib import Path
from typing import Any

from ckpt_tools import layout, storage
from trainer.data.format.remote import (
    BLOCK_SIZE,
    DEFAULT_CACHE_SIZE,
    RemoteFile,
    Store,
    StreamError,
    count_retries,
    unreachable,
)
from trainer.errors import ConfigError


class RemotePath:
    """A file or directory of a streamed dataset: its URL, and the `Store` its bytes are read through."""

    def __init__(self, url: str, store: Store) -> None:
        self.url = url.rstrip("/")
        self.store = store

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"RemotePath({self.url!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemotePath) and other.url == self.url

    def __hash__(self) -> int:
        return hash(self.url)

    def __truediv__(self, name: str) -> RemotePath:
        return RemotePath(f"{self.url}/{name}", self.store)

    @property
    def name(self) -> str:
        return posixpath.basename(self.url)

    def _resolved(self) -> tuple[Any, str]:
        """The filesystem (fsspec caches one per process and options) and the path inside it."""
        return storage.resolve(self.url)

    def _ask(self, question: str, *args: Any) -> Any:
        """`fs.<question>(inner, *args)`, one StreamError line when the store does not answer."""
        fs, inner = self._resolved()
        try:
            return getattr(fs, question)(inner, *args)
        except Exception as exc:
            raise unreachable(self.url, exc, attempts=1) from None

    def is_file(self) -> bool:
        """Whether the object exists (a store that does not answer is a StreamError, not False)."""
        fs, inner = self._resolved()
        try:
            return bool(fs.info(inner)["type"] == "file")
        except FileNotFoundError:
            return False
        except Exception as exc:
            raise unreachable(self.url, exc, attempts=1) from None

    def size(self) -> int:
        return int(self._ask("size"))

    def glob(self, pattern: str) -> list[RemotePath]:
        """The files under this directory matching `pattern` (sorted, as `sorted(Path.glob())` is)."""
        fs, inner = self._resolved()
        try:
            names = fs.glob(f"{inner}/{pattern}")
        except Exception as exc:
            raise unreachable(self.url, exc, attempts=1) from None
        return [self / posixpath.relpath(name, inner) for name in sorted(names)]

    def open(self) -> RemoteFile:
        """The object as a seekable file whose reads are ranged GETs through the store's cache."""
        fs, inner = self._resolved()
        return RemoteFile(fs, self.url, inner, self.size(), self.store)

    def read_text(self, encoding: str = "utf-8") -> str:
        with self.open() as handle:
            return handle.read().decode(encoding)


DatasetPath = Path | RemotePath


def dataset_root(root: str, streaming: bool = False, cache_size: int = DEFAULT_CACHE_SIZE) -> DatasetPath:
    """`--dataset.root` as the readers take it: a URL read in place when streaming (an S3 one needs
    credentials, a Hub one an existing repo and revision), else a local directory."""
    if not streaming:
        if not Path(root).is_dir():
            state = "is not a directory" if Path(root).exists() else "does not exist"
            raise ConfigError(
                f"--dataset.root={root} {state}: pass the LeRobotDataset's directory (the one holding meta/ "
                "and data/), or --dataset.repo_id=ID alone to read it through the Hub cache"
            )
        return Path(root)
    if not layout.is_url(root):
        root = Path(root).absolute().as_uri()
    if root.startswith("s3://"):
        _check_s3_credentials(root)
    if root.startswith("hf://"):
        _check_hub_repo(root)
    count_retries()
    return RemotePath(root, Store(cache_size, block_size=max(1, min(BLOCK_SIZE, cache_size // 4))))


def matching(directory: DatasetPath, pattern: str) -> list[DatasetPath]:
    """The files under `directory` matching the glob `pattern`, sorted."""
    return sorted(directory.glob(pattern), key=str)


def total_size(directory: DatasetPath) -> int:
    """Bytes of every file under `directory` (0 when there is none)."""
    if isinstance(directory, RemotePath):
        fs, inner = storage.resolve(directory.url)
        return int(fs.du(inner)) if fs.isdir(inner) else 0
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file()) if directory.is_dir() else 0


def source(path: DatasetPath) -> Any:
    """What pyarrow and PyAV open: a local path as its string, a streamed file as a `RemoteFile`."""
    return path.open() if isinstance(path, RemotePath) else str(path)


def inside(root: DatasetPath, path: DatasetPath) -> bool:
    """Whether a streamed `path` names an object under `root` (a store has no links to follow; a
    local path is checked by `validate.inside_root`, which resolves them)."""
    relative = posixpath.normpath(str(path)[len(str(root)) :].lstrip("/"))
    return str(path).startswith(str(root) + "/") and not relative.startswith("..")


def _check_s3_credentials(url: str) -> None:
    """One line before any request when no AWS credentials are configured (the environment, the
    shared files, fsspec's config): botocore would otherwise fail each GET with a traceback."""
    import fsspec.config

    options = fsspec.config.conf.get("s3", {})
    if options.get("anon") or options.get("key"):
        return
    import botocore.session

    if botocore.session.get_session().get_credentials() is None:
        raise StreamError(
            f"--dataset.root={url}: no AWS credentials found; set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY (and AWS_ENDPOINT_URL for a non-AWS store), as for checkpoints on S3"
        )


def _check_hub_repo(url: str) -> None:
    """One line before any read when the Hub repo or its revision does not exist (or the token may not
    see it): HfFileSystem would otherwise report every file of the dataset as missing."""
    fs, inner = storage.resolve(url)
    try:
        fs.resolve_path(inner)
    except FileNotFoundError as exc:
        cause = str(exc).split(". ")[0].removeprefix(inner).strip(" ()") or "not found"
        raise StreamError(
            f"--dataset.root={url}: {cause} on {fs.endpoint}; check the repo id and the revision after @ "
            "(hf://datasets/owner/name@revision), and HF_TOKEN for a private repo"
        ) from None
    except Exception as exc:
        raise unreachable(url, exc, attempts=1) from None
