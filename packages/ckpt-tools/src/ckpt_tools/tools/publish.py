"""Publish a model directory to the Hugging Face Hub or to any fsspec target.

Only what a user of the model needs leaves the machine: the safetensors weights (single file, or shards
with their index), a PEFT adapter, the policy and training configs, the processor files and a model
card. DCP shards, optimizer, RNG and other training state never do. A Hub publish is one commit; a
failed publish raises `PublishError` with one line and deletes nothing local.

Tokens come from huggingface_hub's usual places (`HF_TOKEN`, the login cache) unless passed in, and are
never logged, put in an error message or written to the card.
"""

from __future__ import annotations

import json
import logging
import os
import re
import uuid
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ckpt_tools.catalog import ADAPTER, DCP, MODEL, catalog
from ckpt_tools.errors import CorruptCheckpointError, NotACheckpointError, PublishError, UsageError
from ckpt_tools.files import locate, storage
from ckpt_tools.files.sharded_safetensors import read_weight_map
from ckpt_tools.format import layout, weight_sets
from ckpt_tools.format.weight_sets import WeightSetKind
from ckpt_tools.tools.hub_commit import commit_to_hub
from ckpt_tools.tools.model_card import gather_card_info, render_model_card

logger = logging.getLogger(__name__)

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
    kind = weight_sets.choose(weights) if weights is not None else None  # before anything is read
    step_dir, model_dir = locate.resolve_model_dir(path)
    names = select_publish_files(model_dir)
    uploads: dict[str, str | bytes] = {name: layout.join(model_dir, name) for name in names}
    if training_state:
        uploads.update(_training_state_files(step_dir, path))
    if kind is None:
        kind = weight_sets.choose(
            weight_sets.default_choice({w.role for w in catalog(model_dir).weight_sets})
        )
    overlay_notes = []
    if kind.overlays is not None:
        _use_overlay(uploads, model_dir, kind)
        overlay_notes.append(f"published the {kind.label} weights ({kind.written_by}) in the model's place")
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
        url, oid = commit_to_hub(uploads, repo_id, private, revision, message, token, endpoint, tag)
        result = PublishResult(url=url, commit_oid=oid, files=sorted(uploads))
    return replace(result, notes=overlay_notes + notes)


def _use_overlay(uploads: dict[str, str | bytes], model_dir: str, kind: WeightSetKind) -> None:
    """Replace the uploaded weights (one file, or an index and its shards) with the state dict of a set
    that overlays them (`load_model_state_dict(weights="ema")`: the EMA's parameters, the model's
    buffers) in one file."""
    from safetensors.torch import save

    from ckpt_tools.state.evaluation_load import load_model_state_dict

    tensors = load_model_state_dict(model_dir, weights=kind.name)
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
