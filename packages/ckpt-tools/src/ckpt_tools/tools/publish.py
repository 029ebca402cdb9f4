"""Publish a model directory to the Hugging Face Hub or to any fsspec target.

Only what a user of the model needs leaves the machine: the safetensors weights (single file, or shards
with their index), a PEFT adapter, the policy and training configs, the processor files and a model
card. DCP shards, optimizer, RNG and other training state never do. A Hub publish is one commit; a
failed publish raises `PublishError` with one line and deletes nothing local.

Tokens come from huggingface_hub's usual places (`HF_TOKEN`, the login cache) unless passed in, and are
never logged, put in an error message or written to the card.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any, TypeVar

from ckpt_tools.catalog import ADAPTER, DCP, EMA, MODEL, catalog
from ckpt_tools.errors import CorruptCheckpointError, NotACheckpointError, PublishError, UsageError
from ckpt_tools.files import locate, storage
from ckpt_tools.files.safetensors_io import read_weight_map
from ckpt_tools.format import layout
from ckpt_tools.tools.model_card import gather_card_info, render_model_card

logger = logging.getLogger(__name__)
_T = TypeVar("_T")

_SINGLE_FILES = (
    layout.MODEL_SAFETENSORS,
    layout.ADAPTER_SAFETENSORS,
    layout.ADAPTER_CONFIG,
    layout.POLICY_CONFIG,
    layout.TRAIN_CONFIG,
    layout.MODEL_CARD,
)
_PROCESSOR_PREFIXES = (layout.PREPROCESSOR, layout.POSTPROCESSOR)
# A model directory inside huggingface_hub's cache: the base of an adapter that came from the Hub.
_HUB_CACHE_SNAPSHOT = re.compile(r"/models--(?P<namespace>[^/]+?)--(?P<name>[^/]+)/snapshots/[^/]+/?$")
# Text files small enough to scan for a leaked token before they are uploaded.
_TEXT_SUFFIXES = (".json", ".md", ".yaml", ".yml", ".txt")
_TEXT_SCAN_LIMIT = 8 * 1024 * 1024


@dataclass(frozen=True)
class PublishResult:
    """Where the model went: the repo (or target) URL, the Hub commit id, the files in repo order."""

    url: str
    commit_oid: str | None
    files: list[str]
    notes: list[str] = field(default_factory=list)
    """One-line remarks for the user (e.g. an adapter whose base only exists on this machine)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def is_fsspec_target(repo_id: str) -> bool:
    """A URL (`s3://bucket/prefix`, `memory://x`) or a local path; a Hub repo id is `namespace/name`."""
    return layout.is_url(repo_id) or repo_id.startswith(("/", "./", "../", "~"))


def select_publish_files(model_dir: str | os.PathLike[str]) -> list[str]:
    """Names (relative to `model_dir`) of the files a user of the model needs, sorted.

    Raises `PublishError` for a directory holding only DCP shards (run `ckpt convert` first) and
    `CorruptCheckpointError` for a shard index naming a missing shard.
    """
    root = os.fspath(model_dir).rstrip("/")
    storage.check_links(root)  # a link out is refused; a Hub cache snapshot's links are followed
    fs, inner = storage.resolve(root)
    entries = {layout.name(entry["name"]): entry["type"] for entry in fs.ls(inner, detail=True)}
    present = {name for name, kind in entries.items() if _is_file(fs, inner, name, kind)}
    selected = {name for name in present if name in _SINGLE_FILES or name.startswith(_PROCESSOR_PREFIXES)}
    if layout.MODEL_INDEX in present:
        selected |= {layout.MODEL_INDEX, *_index_shards(root, present)}
    if not selected & {layout.MODEL_SAFETENSORS, layout.MODEL_INDEX, layout.ADAPTER_SAFETENSORS}:
        raise _no_weights_error(root)
    return sorted(selected)


def publish_model(
    path: str | os.PathLike[str],
    repo_id: str,
    *,
    private: bool = False,
    revision: str | None = None,
    commit_message: str | None = None,
    token: str | None = None,
    endpoint: str | None = None,
    extra_card_info: dict[str, Any] | None = None,
    weights: str | None = None,
    tag: str | None = None,
    training_state: bool = False,
) -> PublishResult:
    """Publish the model at `path` (a step dir, its `pretrained_model/`, `last`, or a converted model
    dir) to the Hub repo `repo_id`, or copy it to `repo_id` when that is an fsspec URL or local path.

    A model card is generated unless the directory has its own `README.md`. Not collective: the trainer
    calls it from the main rank behind its own barrier. `weights="ema"` publishes the step's EMA (its
    gathered file or its shards) in the model's place, as the one `model.safetensors` (or
    `adapter_model.safetensors`) a Hub user loads, so the repo reads like any other; None takes the EMA
    when the step holds one (the default, as `trainer eval` scores it), the model otherwise. The result's notes say so.
    `tag` names the commit as well (moved there when an earlier publish left a tag of that name), so it
    can be loaded by revision; `training_state=True` adds the step's `training_state/` (optimizer, RNG,
    sampler position) under the same path, for a step pushed to be resumed from elsewhere.
    """
    if weights not in (None, "model", "ema"):
        raise UsageError(f"--weights={weights}: choose model or ema", option="--weights")
    step_dir, model_dir = locate.resolve_model_dir(path)
    names = select_publish_files(model_dir)
    uploads: dict[str, str | bytes] = {name: layout.join(model_dir, name) for name in names}
    if training_state:
        uploads.update(_training_state_files(step_dir, path))
    ema_notes = []
    if weights == "ema" or (weights is None and catalog(model_dir).of_role(EMA)):
        _use_ema(uploads, model_dir)
        ema_notes.append("published the EMA weights (--ema.enable) in the model's place")
    if layout.MODEL_CARD not in uploads:
        info = gather_card_info(step_dir, model_dir, names, extra_card_info)
        uploads[layout.MODEL_CARD] = render_model_card(info, repo_id).encode()
    notes = _portable_adapter_base(uploads)
    if is_fsspec_target(repo_id):
        if private or revision or tag:
            raise PublishError(f"--private, --revision and tags apply to Hub repos only, not to {repo_id}")
        result = _publish_fsspec(uploads, repo_id)
    else:
        message = commit_message or _default_message(step_dir)
        result = _publish_hub(uploads, repo_id, private, revision, message, token, endpoint, tag)
    return replace(result, notes=ema_notes + notes)


def _use_ema(uploads: dict[str, str | bytes], model_dir: str) -> None:
    """Replace the uploaded weights (one file, or an index and its shards) with the EMA state dict
    (`load_model_state_dict(weights="ema")`: the EMA's parameters, the model's buffers) in one file."""
    from safetensors.torch import save

    from ckpt_tools.state.evaluation_load import load_model_state_dict

    tensors = load_model_state_dict(model_dir, weights="ema")
    name = layout.ADAPTER_SAFETENSORS if layout.ADAPTER_SAFETENSORS in uploads else layout.MODEL_SAFETENSORS
    if layout.MODEL_INDEX in uploads:
        for shard in set(read_weight_map(layout.join(model_dir, layout.MODEL_INDEX)).values()):
            uploads.pop(shard, None)
        del uploads[layout.MODEL_INDEX]
    uploads[name] = save(tensors, metadata={"format": "pt"})


def _training_state_files(step_dir: str | None, path: str | os.PathLike[str]) -> dict[str, str]:
    """Every file of the step's `training_state/`, by its path inside the step directory."""
    if step_dir is None:
        raise UsageError(
            f"{os.fspath(path)} is a model directory, not a step directory: it has no training state to "
            "publish; pass the step directory",
            option="training_state",
        )
    root = layout.join(step_dir, layout.TRAINING_STATE_DIR)
    fs, inner = storage.resolve(root)
    relative = [name[len(inner) :].lstrip("/") for name in fs.find(inner, detail=False)]
    return {f"{layout.TRAINING_STATE_DIR}/{name}": layout.join(root, name) for name in relative}


def _portable_adapter_base(uploads: dict[str, str | bytes]) -> list[str]:
    """A published adapter must name a base others can fetch. A base recorded as a local path inside
    huggingface_hub's cache (`.../models--ns--name/snapshots/<rev>`) came from the Hub: the published
    adapter_config.json names `ns/name` instead. Any other local path is published as it is, with one
    note saying that the adapter's users must supply the base themselves."""
    source = uploads.get(layout.ADAPTER_CONFIG)
    if source is None:
        return []
    raw = source if isinstance(source, bytes) else storage.read_bytes(source)
    config = json.loads(raw)
    base = config.get("base_model_name_or_path")
    if not isinstance(base, str) or not is_fsspec_target(base) or layout.is_url(base):
        return []  # no base, a Hub repo id already, or a URL anyone with access can read
    found = _HUB_CACHE_SNAPSHOT.search(base.replace(os.sep, "/"))
    if found is None:
        return [
            f"adapter_config.json names the local base model {base}: users of the published adapter must "
            "supply the base themselves (publish the base too, or train from its Hub id as --policy.path)"
        ]
    config["base_model_name_or_path"] = f"{found['namespace']}/{found['name']}"
    uploads[layout.ADAPTER_CONFIG] = json.dumps(config, indent=2).encode()
    return []


# --- Hub --------------------------------------------------------------------------------------------


def _publish_hub(
    uploads: dict[str, str | bytes],
    repo_id: str,
    private: bool,
    revision: str | None,
    message: str,
    token: str | None,
    endpoint: str | None,
    tag: str | None,
) -> PublishResult:
    from huggingface_hub import CommitOperationAdd, HfApi

    from ckpt_tools import __version__

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
    return PublishResult(url=repo_url, commit_oid=commit.oid, files=sorted(uploads))


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


def _default_message(step_dir: str | None) -> str:
    if step_dir is not None and not layout.is_url(step_dir):
        step_dir = os.path.realpath(step_dir)  # `last` -> 005000
    name = layout.name(step_dir or "")
    if layout.is_step_dir_name(name):
        return f"Upload model from step {name} with ckpt-tools"
    return "Upload model with ckpt-tools"


# --- fsspec -----------------------------------------------------------------------------------------


def _publish_fsspec(uploads: dict[str, str | bytes], target: str) -> PublishResult:
    """Copy every file under a temporary name first, then rename them all into place, so a failed
    copy leaves no half-written file under a final name and replaces nothing."""
    fs, root = storage.resolve(target)
    tag = f"{layout.TMP_PREFIX}{uuid.uuid4().hex[:8]}-"
    staged: list[tuple[str, str]] = []
    try:
        fs.makedirs(root, exist_ok=True)
        for name, source in sorted(uploads.items()):
            staged.append((f"{root}/{tag}{name}", f"{root}/{name}"))
            _write(fs, staged[-1][0], source)
        for tmp, final in staged:
            fs.mv(tmp, final)
    except OSError as exc:
        _remove_quietly(fs, [tmp for tmp, _ in staged])
        raise PublishError(f"cannot write to {target}: {exc}; nothing local was deleted") from exc
    logger.info("published %d files to %s", len(staged), target)
    return PublishResult(url=target, commit_oid=None, files=sorted(uploads))


def _write(fs: Any, dest: str, source: str | bytes) -> None:
    """Stream one file to the target in `storage.SEQUENTIAL_PIECE` reads, uploaded in `storage.STREAM_BLOCK` parts
    (bounded memory on any store)."""
    parts = {} if storage.is_local(fs) else {"block_size": storage.STREAM_BLOCK}
    with fs.open(dest, "wb", **parts) as out:
        if isinstance(source, bytes):
            out.write(source)
            return
        with storage.open_sequential(source) as src:
            while chunk := src.read(storage.SEQUENTIAL_PIECE):
                out.write(chunk)


def _remove_quietly(fs: Any, paths: list[str]) -> None:
    for path in paths:
        try:
            if fs.exists(path):
                fs.rm(path)
        except OSError:
            logger.warning("could not remove the temporary file %s", path)


# --- selection helpers ------------------------------------------------------------------------------


def _is_file(fs: Any, inner: str, name: str, kind: str) -> bool:
    """A listed entry that is a file: fsspec lists a local link as `other`, so a link (to a file inside
    the directory, or a Hub cache snapshot's link to its blob) is asked where it leads."""
    if kind == "other" and storage.is_local(fs):
        return os.path.isfile(os.path.join(inner, name))
    return kind == "file"


def _index_shards(model_dir: str, present: set[str]) -> set[str]:
    index_path = layout.join(model_dir, layout.MODEL_INDEX)
    shards = set(read_weight_map(index_path).values())  # every shard inside model_dir
    missing = sorted(shards - present)
    if missing:
        raise CorruptCheckpointError(
            f"{index_path} names {missing[0]}, which is missing; re-run `ckpt convert` to rewrite the shards"
        )
    return shards


def _no_weights_error(model_dir: str) -> Exception:
    """Why a directory has nothing to publish: DCP shards only (convert first), or no weights at all."""
    shards = [w for w in catalog(model_dir).weight_sets if w.format == DCP and w.role in (MODEL, ADAPTER)]
    if shards:
        return PublishError(
            f"{model_dir} holds only DCP shards ({shards[0].path.rsplit('/', 1)[-1]}/), which the Hub "
            f"cannot load: run `ckpt convert {model_dir}` first and publish its output"
        )
    return NotACheckpointError(
        f"{model_dir} has no model weights ({layout.MODEL_SAFETENSORS}, {layout.MODEL_INDEX} or "
        f"{layout.ADAPTER_SAFETENSORS}); pass a step directory or a converted model directory"
    )
