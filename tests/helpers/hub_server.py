"""A small Hugging Face Hub-compatible HTTP server for the publishing tests.

It implements the endpoints huggingface_hub uses to create a model repo and commit files to it (the
requests of `HfApi.create_repo`, `create_commit`, `preupload_lfs_files`, `create_tag` and `delete_tag`),
keeps repos, commits (each with the files it left), tags and LFS objects in memory, and can be told to
fail a route with a given status (for ever, or the next N requests), to answer it slowly, or to hold it
after a number of commits until released (a push stalled for as long as a test needs). It also serves
dataset repos seeded with `add_dataset` through the endpoints huggingface_hub's `HfFileSystem` reads
(`repo_info`, `tree`, `paths-info`, and `resolve` with HTTP Range requests answered 206, as the Hub
does), with the Hub's `X-Error-Code` on a missing repo, revision or file. It runs on 127.0.0.1 with
a random port in a background thread, so the real client (`HfApi(endpoint=server.url)`) runs end to
end with no network. The client must run with `HF_HUB_DISABLE_XET=1` (set before huggingface_hub is
imported).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, parse_qsl, unquote, urlsplit

# Files the server stores through LFS: what the Hub would route to LFS (binary, or large).
_LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".npy")
_LFS_MIN_SIZE = 10 * 1024 * 1024


@dataclass
class Commit:
    oid: str
    branch: str
    summary: str
    files: list[str]
    snapshot: dict[str, bytes] = field(default_factory=dict)  # the branch's files after this commit


@dataclass
class Repo:
    repo_id: str
    private: bool
    branches: dict[str, dict[str, bytes]] = field(default_factory=lambda: {"main": {}})
    commits: list[Commit] = field(default_factory=list)
    tags: dict[str, str] = field(default_factory=dict)  # tag -> commit oid


@dataclass
class Request:
    """One request as the server saw it; `authorization` is the raw header, for token checks."""

    method: str
    path: str
    route: str
    authorization: str | None
    range: str | None = None  # the Range header of a file read


@dataclass
class HubState:
    repos: dict[str, Repo] = field(default_factory=dict)
    datasets: dict[str, Repo] = field(default_factory=dict)  # dataset repos, seeded by `add_dataset`
    lfs: dict[str, bytes] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    failures: dict[str, int] = field(default_factory=dict)
    failures_left: dict[str, int] = field(default_factory=dict)  # route -> forced failures still to answer
    delays: dict[str, float] = field(default_factory=dict)
    holds: dict[str, int] = field(default_factory=dict)  # route -> commits after which it is held
    held: list[str] = field(default_factory=list)  # the route of each request held so far
    released: threading.Event = field(default_factory=threading.Event)  # ends the waits of `slow`
    lock: threading.Lock = field(default_factory=threading.Lock)


class HubError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code  # the Hub's X-Error-Code (RepoNotFound, RevisionNotFound, EntryNotFound)


@dataclass
class Raw:
    """A reply that is a file's bytes rather than JSON."""

    data: bytes
    headers: Mapping[str, str] = field(default_factory=dict)


# (method, regex over the path, route name). The route name is what `HubServer.fail` takes.
_ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    ("POST", re.compile(r"^/api/repos/create$"), "create"),
    ("POST", re.compile(r"^/api/validate-yaml$"), "validate_yaml"),
    ("GET", re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)$"), "repo_info"),
    ("POST", re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/preupload/(?P<rev>[^/]+)$"), "preupload"),
    ("POST", re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/commit/(?P<rev>[^/]+)$"), "commit"),
    ("POST", re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/branch/(?P<rev>[^/]+)$"), "branch"),
    ("POST", re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tag/(?P<rev>[^/]+)$"), "tag"),
    ("DELETE", re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tag/(?P<rev>[^/]+)$"), "delete_tag"),
    ("POST", re.compile(r"^/(?P<repo>[^/]+/[^/]+)\.git/info/lfs/objects/batch$"), "lfs_batch"),
    ("PUT", re.compile(r"^/lfs-upload/(?P<oid>[0-9a-f]{64})$"), "lfs_upload"),
    ("POST", re.compile(r"^/lfs-verify/(?P<oid>[0-9a-f]{64})$"), "lfs_verify"),
    (
        "GET",
        re.compile(r"^/api/datasets/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<rev>[^/]+))?$"),
        "dataset_info",
    ),
    (
        "GET",
        re.compile(r"^/api/datasets/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)(?:/(?P<path>.+))?$"),
        "tree",
    ),
    ("POST", re.compile(r"^/api/datasets/(?P<repo>[^/]+/[^/]+)/paths-info/(?P<rev>[^/]+)$"), "paths_info"),
    ("GET", re.compile(r"^/datasets/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$"), "resolve"),
]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
        pass

    def do_POST(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_GET(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        url = urlsplit(self.path)
        path = url.path
        body = self._read_body()
        route, params = _match(self.command, path)
        params = {**dict(parse_qsl(url.query)), **params}  # a tree listing's recursive=
        state = self.server.state
        with state.lock:
            state.requests.append(
                Request(
                    self.command, path, route, self.headers.get("Authorization"), self.headers.get("Range")
                )
            )
            forced = state.failures.get(route)
            if state.failures_left.get(route, 0) > 0:
                state.failures_left[route] -= 1
                forced = 500
            delay, released = state.delays.get(route, 0.0), state.released
            commits = sum(len(repo.commits) for repo in state.repos.values())
            hold = route in state.holds and commits >= state.holds[route]
            if hold:
                state.held.append(route)
        released.wait(None if hold else delay)  # outside the lock: other requests go on meanwhile
        try:
            if forced is not None:
                raise HubError(forced, f"forced {forced} on {route}")
            if route == "unknown":
                raise HubError(404, f"no such endpoint: {self.command} {path}")
            handler = getattr(self, f"_{route}")
            with state.lock:
                status, payload = handler(params, body)
        except HubError as exc:
            status, payload = exc.status, {"error": str(exc)}
            self._reply(status, payload, {"X-Error-Code": exc.code} if exc.code else {})
            return
        self._reply(status, payload)

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    self.rfile.readline()
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length", 0)))

    def _reply(self, status: int, payload: Any, headers: Mapping[str, str] | None = None) -> None:
        """JSON, or a file's bytes (`Raw`) with its own headers."""
        is_file = isinstance(payload, Raw)
        data = payload.data if is_file else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream" if is_file else "application/json")
        for name, value in {**(headers or {}), **(payload.headers if is_file else {})}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _repo(self, repo_id: str) -> Repo:
        repo = self.server.state.repos.get(repo_id)
        if repo is None:
            raise HubError(404, f"repository {repo_id} not found")
        return repo

    # --- routes (called under the state lock) -------------------------------------------------------

    def _create(self, params: dict[str, str], body: bytes) -> tuple[int, Any]:
        data = json.loads(body)
        repo_id = f"{data.get('organization') or 'user'}/{data['name']}"
        url = f"{self.server.url}/{repo_id}"
        if repo_id in self.server.state.repos:
            return 409, {"error": "You already created this model repo", "url": url}
        private = data.get("visibility") == "private" or bool(data.get("private"))
        self.server.state.repos[repo_id] = Repo(repo_id=repo_id, private=private)
        return 200, {"url": url, "name": repo_id}

    def _repo_info(self, params: dict[str, str], body: bytes) -> tuple[int, Any]:
        # The client asks this when create answers 401/403 with exist_ok: the repo may exist already.
        repo = self._repo(params["repo"])
        sha = repo.commits[-1].oid if repo.commits else None
        return 200, {"id": repo.repo_id, "private": repo.private, "sha": sha}

    def _validate_yaml(self, params: dict[str, str], body: bytes) -> tuple[int, Any]:
        return 200, {"errors": [], "warnings": []}

    def _branch(self, params: dict[str, str], body: bytes) -> tuple[int, Any]:
        repo = self._repo(params["repo"])
        branch = unquote(params["rev"])
        if branch in repo.branches:
            raise HubError(409, f"branch {branch} already exists")
        repo.branches[branch] = dict(repo.branches["main"])
        return 200, {}

    def _preupload(self, params: dict[str, str], body: bytes) -> tuple[int, Any]:
        self._repo(params["repo"])
        files = []
        for entry in json.loads(body)["files"]:
            sample = base64.b64decode(entry["sample"])
            lfs = entry["path"].endswith(_LFS_SUFFIXES) or b"\0" in sample or entry["size"] >= _LFS_MIN_SIZE
            files.append(
                {"path": entry["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False}
            )
        return 200, {"files": files}

    def _lfs_batch(self, params: dict[str, str], body: bytes) -> tuple[int, Any]:
        self._repo(params["repo"])
        objects = []
        for obj in json.loads(body)["objects"]:
            reply: dict[str, Any] = {"oid": obj["oid"], "size": int(obj["size"])}
            if obj["oid"] not in self.server.state.lfs:
                reply["actions"] = {
                    "upload": {"href": f"{self.server.url}/lfs-upload/{obj['oid']}"},
                    "verify": {"href": f"{self.server.url}/lfs-verify/{obj['oid']}"},
                }
            objects.append(reply)
        return 200, {"transfer": "basic", "objects": objects}

    def _lfs_upload(self, params: dict[str, str], body: bytes) -> tuple[int, Any]:
        if hashlib.sha256(body).hexdigest() != params["oid"]:
            raise HubError(400, "uploaded bytes do not match the oid")
        self.server.state.lfs[params["oid"]] = body
        return 200, {}

    def _lfs_verify(self, params: dict[str, str], body: bytes) -> tuple[int, Any]:
        data = json.loads(body)
        stored = self.server.state.lfs.get(params["oid"])
        if stored is None or len(stored) != data["size"]:
            raise HubError(404, f"LFS object {params['oid']} missing or of the wrong size")
        return 200, {}

    def _commit(self, params: dict[str, str], body: bytes) -> tuple[int, Any]:
        repo = self._repo(params["repo"])
        branch = unquote(params["rev"])
        if branch not in repo.branches:
            raise HubError(404, f"revision {branch} not found")
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        header = next(line["value"] for line in lines if line["key"] == "header")
        files: dict[str, bytes] = {}
        for line in lines:
            value = line["value"]
            if line["key"] == "file":
                files[value["path"]] = base64.b64decode(value["content"])
            elif line["key"] == "lfsFile":
                data = self.server.state.lfs.get(value["oid"])
                if data is None or len(data) != value["size"]:
                    raise HubError(400, f"LFS object for {value['path']} was never uploaded")
                files[value["path"]] = data
        repo.branches[branch].update(files)
        oid = hashlib.sha1(body + str(len(repo.commits)).encode()).hexdigest()  # same files twice: 2 commits
        repo.commits.append(
            Commit(oid, branch, header["summary"], sorted(files), dict(repo.branches[branch]))
        )
        url = f"{self.server.url}/{repo.repo_id}/commit/{oid}"
        return 200, {"commitUrl": url, "commitOid": oid, "success": True}

    def _tag(self, params: dict[str, str], body: bytes) -> tuple[int, Any]:
        repo = self._repo(params["repo"])
        revision, tag = unquote(params["rev"]), json.loads(body)["tag"]
        oid = next((c.oid for c in repo.commits if c.oid == revision), None)
        if oid is None and revision in repo.branches:
            oid = next((c.oid for c in reversed(repo.commits) if c.branch == revision), None)
        if oid is None:
            raise HubError(404, f"revision {revision} not found")
        if tag in repo.tags:
            raise HubError(409, f"tag {tag} already exists")
        repo.tags[tag] = oid
        return 200, {}

    def _delete_tag(self, params: dict[str, str], body: bytes) -> tuple[int, Any]:
        repo = self._repo(params["repo"])
        if repo.tags.pop(unquote(params["rev"]), None) is None:
            raise HubError(404, f"tag {params['rev']} not found")
        return 200, {}

    # --- dataset repos, read by HfFileSystem ------------------------------------------------------------

    def _snapshot(self, params: dict[str, str]) -> tuple[Repo, dict[str, bytes]]:
        """The files of a dataset repo at a revision (a branch, a tag or a commit oid)."""
        repo = self.server.state.datasets.get(params["repo"])
        if repo is None:
            raise HubError(404, f"repository {params['repo']} not found", "RepoNotFound")
        revision = unquote(params.get("rev") or "main")
        if revision in repo.branches:
            return repo, repo.branches[revision]
        oid = repo.tags.get(revision, revision)
        commit = next((c for c in repo.commits if c.oid == oid), None)
        if commit is None:
            raise HubError(404, f"revision {revision} not found", "RevisionNotFound")
        return repo, commit.snapshot

    def _dataset_info(self, params: dict[str, str], body: bytes) -> tuple[int, Any]:
        repo, _ = self._snapshot(params)
        return 200, {"id": repo.repo_id, "private": repo.private, "sha": repo.commits[-1].oid}

    def _tree(self, params: dict[str, str], body: bytes) -> tuple[int, Any]:
        """The entries under a folder: its children, or with recursive=True every file and folder below
        (one page: the Hub pages after 1000 entries, more than a test dataset holds)."""
        _, files = self._snapshot(params)
        folder = unquote(params.get("path") or "").strip("/")
        recursive = params.get("recursive", "False").lower() == "true"
        entries = _entries(files, folder, recursive)
        if folder and not entries:
            raise HubError(404, f"{folder} not found", "EntryNotFound")
        return 200, entries

    def _paths_info(self, params: dict[str, str], body: bytes) -> tuple[int, Any]:
        _, files = self._snapshot(params)
        asked = parse_qs(body.decode()).get("paths", [])
        every = _entries(files, "", recursive=True)
        return 200, [entry for entry in every if entry["path"] in asked]

    def _resolve(self, params: dict[str, str], body: bytes) -> tuple[int, Any]:
        """A file's bytes; a `Range: bytes=a-b` request is answered 206 with those bytes only."""
        _, files = self._snapshot(params)
        name = unquote(params["path"])
        if name not in files:
            raise HubError(404, f"{name} not found", "EntryNotFound")
        data = files[name]
        asked = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
        if asked is None:
            return 200, Raw(data, {"Accept-Ranges": "bytes"})
        start, end = int(asked.group(1)), min(int(asked.group(2) or len(data) - 1), len(data) - 1)
        if start >= len(data):
            return 416, Raw(b"", {"Content-Range": f"bytes */{len(data)}"})
        part = data[start : end + 1]
        return 206, Raw(part, {"Content-Range": f"bytes {start}-{end}/{len(data)}", "Accept-Ranges": "bytes"})


def _entries(files: dict[str, bytes], folder: str, recursive: bool) -> list[dict[str, Any]]:
    """The tree entries under `folder`, as the Hub lists them: files with their git blob oid and size,
    folders with size 0."""
    prefix = f"{folder}/" if folder else ""
    found: dict[str, dict[str, Any]] = {}
    for name, data in sorted(files.items()):
        if not name.startswith(prefix):
            continue
        parts = name[len(prefix) :].split("/")
        for depth in range(1, len(parts)):
            sub = prefix + "/".join(parts[:depth])
            if recursive or depth == 1:
                found.setdefault(
                    sub,
                    {
                        "type": "directory",
                        "oid": hashlib.sha1(sub.encode()).hexdigest(),
                        "size": 0,
                        "path": sub,
                    },
                )
        if recursive or len(parts) == 1:
            blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
            found[name] = {"type": "file", "oid": blob, "size": len(data), "path": name}
    return list(found.values())


def _match(method: str, path: str) -> tuple[str, dict[str, str]]:
    for route_method, pattern, name in _ROUTES:
        found = pattern.match(path)
        if found and method == route_method:
            return name, found.groupdict()
    return "unknown", {}


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, state: HubState) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.state = state
        self.url = f"http://127.0.0.1:{self.server_address[1]}"

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away (a trainer killed mid-upload) is part of the tests, not an error:
        socketserver would print its traceback into whichever test's stderr is captured by then."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class HubServer:
    """Start with `with HubServer() as hub:`; point the client at `hub.url`."""

    def __init__(self) -> None:
        self.state = HubState()
        self._server = _Server(self.state)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        return self._server.url

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.state.released.set()  # no handler thread outlives the server in a wait
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def fail(self, route: str, status: int) -> None:
        """Answer every request to `route` (a name from `_ROUTES`) with `status` from now on."""
        with self.state.lock:
            self.state.failures[route] = status

    def fail_next(self, route: str, times: int) -> None:
        """Answer the next `times` requests to `route` with HTTP 500, then serve it again."""
        with self.state.lock:
            self.state.failures_left[route] = times

    def slow(self, route: str, seconds: float) -> None:
        """Wait `seconds` before answering each request to `route` (an upload in flight, for longer);
        0 also ends the waits in progress and the `hold` of `route`."""
        with self.state.lock:
            self.state.delays[route] = seconds
            if not seconds:
                self.state.holds.pop(route, None)
                self.state.released.set()
                self.state.released = threading.Event()

    def hold(self, route: str, after_commits: int) -> None:
        """Hold every request to `route` made once the server has taken `after_commits` commits, until
        `slow(route, 0)`: a push stalled there for as long as the test needs, on a machine of any speed
        (the client sets no timeout). `held` counts the requests held."""
        with self.state.lock:
            self.state.holds[route] = after_commits

    def held(self, route: str) -> int:
        """How many requests to `route` a `hold` has stopped (answered or not)."""
        with self.state.lock:
            return self.state.held.count(route)

    def add_dataset(self, repo_id: str, files: dict[str, bytes]) -> str:
        """A dataset repo holding `files` (path in the repo -> bytes) in one commit on main; its oid."""
        oid = hashlib.sha1(json.dumps([repo_id, sorted(files)]).encode()).hexdigest()
        repo = Repo(repo_id=repo_id, private=False, branches={"main": dict(files)})
        repo.commits.append(Commit(oid, "main", "add dataset", sorted(files), dict(files)))
        with self.state.lock:
            self.state.datasets[repo_id] = repo
        return oid

    def repo(self, repo_id: str) -> Repo:
        return self.state.repos[repo_id]

    def files(self, repo_id: str, branch: str = "main") -> dict[str, bytes]:
        return dict(self.state.repos[repo_id].branches[branch])

    def tagged(self, repo_id: str, tag: str) -> dict[str, bytes]:
        """The files of the commit `tag` names."""
        repo = self.state.repos[repo_id]
        return dict(next(c.snapshot for c in repo.commits if c.oid == repo.tags[tag]))

    def routes(self) -> list[str]:
        return [request.route for request in self.state.requests]
