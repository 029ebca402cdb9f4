"""One Hub commit of a model's files: the repo and branch created when missing, the upload, the tag,
every client failure mapped to a one-line `PublishError` that says whether a retry may help, and no
token ever leaving in a file, an error or a traceback. `publish.py` chooses the files."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from ckpt_tools.errors import PublishError
from ckpt_tools.files import storage
from ckpt_tools.format import layout

logger = logging.getLogger("ckpt_tools.tools.publish")  # one logger for a publish, wherever it runs
_T = TypeVar("_T")
# Text files small enough to scan for a leaked token before they are uploaded.
_TEXT_SUFFIXES = (".json", ".md", ".yaml", ".yml", ".txt")
_TEXT_SCAN_LIMIT = 8 * 1024 * 1024


def commit_to_hub(
    uploads: dict[str, str | bytes],
    repo_id: str,
    private: bool,
    revision: str | None,
    message: str,
    token: str | None,
    endpoint: str | None,
    tag: str | None,
) -> tuple[str, str]:
    """Create the repo (and branch) if needed, upload `uploads` (repo path -> local path, URL or bytes)
    as one commit, tag it; returns the repo URL and the commit id. Every failure is one `PublishError`."""
    from huggingface_hub import CommitOperationAdd, HfApi

    from ckpt_tools._version import __version__

    api = HfApi(endpoint=endpoint, token=token, library_name="ckpt-tools", library_version=__version__)
    api_token = api.token if isinstance(api.token, str) else None  # True means "the cached one"
    _refuse_token_in_files(uploads, token or api_token or _cached_token())
    logger.info("publishing %d files to %s on %s", len(uploads), repo_id, api.endpoint)
    repo_url = _hub_call(
        api.endpoint, f"creating repo {repo_id}", lambda: _create_repo(api, repo_id, private)
    )
    if revision and revision != "main" and not revision.startswith("refs/"):
        _hub_call(
            api.endpoint,
            f"creating branch {revision}",
            lambda: api.create_branch(repo_id, branch=revision, exist_ok=True),
        )
    operations = [
        CommitOperationAdd(path_in_repo=name, path_or_fileobj=_local_or_bytes(source))
        for name, source in sorted(uploads.items())
    ]
    commit = _hub_call(
        api.endpoint,
        f"committing to {repo_id}",
        lambda: api.create_commit(repo_id, operations, commit_message=message, revision=revision),
    )
    if tag is not None:
        _hub_call(
            api.endpoint,
            f"tagging commit {commit.oid[:8]} as {tag}",
            lambda: _tag(api, repo_id, tag, commit.oid),
        )
    logger.info("published %s at commit %s", repo_id, commit.oid)
    return repo_url, commit.oid


def _tag(api: Any, repo_id: str, tag: str, oid: str) -> None:
    """Point `tag` at commit `oid`. A tag of that name already there (a run resumed from an earlier step
    saves the later steps again) is moved: a step's tag names the weights that step last had."""
    from huggingface_hub.errors import HfHubHTTPError

    try:
        api.create_tag(repo_id, tag=tag, revision=oid)
    except HfHubHTTPError as exc:
        if exc.response is None or exc.response.status_code != 409:
            raise
        api.delete_tag(repo_id, tag=tag)
        api.create_tag(repo_id, tag=tag, revision=oid)


def _create_repo(api: Any, repo_id: str, private: bool) -> str:
    from huggingface_hub.errors import HfUriError

    try:
        return str(api.create_repo(repo_id, private=True if private else None, exist_ok=True))
    except HfUriError:
        # A token that may write but not create gets 401/403 from create; the client then finds the repo
        # exists but, on an endpoint other than huggingface.co, fails to spell its URL. The repo is there.
        return f"{api.endpoint}/{repo_id}"


def _hub_call(endpoint: str, action: str, call: Callable[[], _T]) -> _T:
    """Run one client call, turning its failures into one-line `PublishError`s.

    The client's exception is dropped as cause and as context (the mapped error is raised after the
    handler has ended): it carries the request, and with it the Authorization header, which must never
    reach a traceback, a log or an error reporter that walks `__context__`.
    """
    try:
        return call()
    except Exception as exc:
        mapped = _map_hub_failure(exc, endpoint, action)
        if mapped is None:
            raise
        logger.debug("publish failed while %s: %s", action, type(exc).__name__)
    raise mapped


def _map_hub_failure(exc: BaseException, endpoint: str, action: str) -> PublishError | None:
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError

    if isinstance(exc, HFValidationError):
        return PublishError(
            f"{action}: not a Hub repo id (namespace/name), nor a URL or a path starting with / or ./"
        )
    for err in _cause_chain(exc):
        if isinstance(err, HfHubHTTPError):
            status = err.response.status_code if err.response is not None else None
            if status in (401, 403):
                return PublishError(
                    f"not authorized while {action} on {endpoint} (HTTP {status}): set HF_TOKEN or run "
                    "`hf auth login` with a write token; nothing was deleted"
                )
            if status is not None and (status >= 500 or status == 429):
                kind = "rate limit" if status == 429 else "server error"
                return PublishError(
                    f"Hub {kind} (HTTP {status}) while {action} on {endpoint}; retry later; "
                    "nothing was deleted",
                    transient=True,
                )
            detail = " ".join((err.server_message or "").split())
            return PublishError(
                f"the Hub refused {action} (HTTP {status}{': ' + detail if detail else ''}); nothing was deleted"
            )
        if isinstance(err, _transport_errors()):
            return PublishError(
                f"cannot reach {endpoint} while {action} ({type(err).__name__}): check the network / "
                "HF_ENDPOINT; nothing was deleted",
                transient=True,
            )
    return None


def _cause_chain(exc: BaseException) -> Iterator[BaseException]:
    """The exception and what it wraps (an LFS upload failure arrives as a RuntimeError around it)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _transport_errors() -> tuple[type[BaseException], ...]:
    """Connection-level errors of whichever HTTP library this huggingface_hub uses."""
    kinds: list[type[BaseException]] = [ConnectionError, TimeoutError]
    for name, attr in (
        ("httpx2", "TransportError"),
        ("httpx", "TransportError"),
        ("requests", "ConnectionError"),
    ):
        try:
            kinds.append(getattr(importlib.import_module(name), attr))
        except (ImportError, AttributeError):
            continue
    return tuple(kinds)


def _cached_token() -> str | None:
    from huggingface_hub import get_token

    return get_token()


def _refuse_token_in_files(uploads: dict[str, str | bytes], token: str | None) -> None:
    """A config that captured the token (an env dump, a copied CLI line) must not be published."""
    if not token or len(token) < 8:
        return
    for name, source in uploads.items():
        if not name.endswith(_TEXT_SUFFIXES):
            continue
        data = source if isinstance(source, bytes) else _read_small(source)
        if data is not None and token.encode() in data:
            raise PublishError(f"{name} contains your Hub token; remove it from the file before publishing")


def _read_small(path: str) -> bytes | None:
    fs, inner = storage.resolve(path)
    return storage.read_bytes(path) if fs.size(inner) <= _TEXT_SCAN_LIMIT else None


def _local_or_bytes(source: str | bytes) -> str | bytes:
    """A local file uploads from its path (streamed); a file on another fsspec store is read first."""
    if isinstance(source, bytes) or not layout.is_url(source):
        return source
    return storage.read_bytes(source)
