"""The integrity manifest of a step: `manifest.json` at the step's root lists every file the save
wrote, with its size and sha256 (computed while writing, `digest.py`).

`ckpt verify` checks the sizes (a stat per file); `ckpt verify --deep` re-hashes every listed file and
names each whose bytes changed: a flipped byte, a truncated file, two files swapped. Files added after
the save (`ckpt convert` outputs, an `export-<dtype>/` copy) are not listed and not checked here; a
conversion that deletes or rewrites a listed file updates the manifest. A step without a manifest
(an older save, another tool's) verifies as before.
"""

from __future__ import annotations

import hashlib
import posixpath
from typing import Any

from ckpt_tools.errors import CorruptCheckpointError, Finding
from ckpt_tools.files import storage
from ckpt_tools.files.digest import Recorder
from ckpt_tools.format import layout
from ckpt_tools.format.untrusted import describe

VERSION = 1
_BLOCK = 16 * 1024 * 1024


def write_bytes(path: str, data: bytes, recorder: Recorder | None) -> None:
    """Write a whole file, recording its size and digest from the same bytes."""
    storage.write_bytes(path, data)
    if recorder is not None:
        recorder.record_bytes(path, data)


def write_json(path: str, value: Any, recorder: Recorder | None) -> None:
    write_bytes(path, storage.json_bytes(value), recorder)


def _inner(path: str) -> str:
    return storage.resolve(path)[1].rstrip("/")


def write_manifest(step_dir: str, files: dict[str, tuple[int, str]]) -> None:
    """Write `manifest.json` into `step_dir` from recorded `path -> (size, sha256)`, paths made
    relative to the step directory (files outside it are left out)."""
    root = _inner(step_dir) + "/"
    entries = {
        _inner(path).removeprefix(root): {"size": size, "sha256": sha}
        for path, (size, sha) in files.items()
        if _inner(path).startswith(root)
    }
    storage.write_json(layout.join(step_dir, layout.MANIFEST), {"version": VERSION, "files": entries})


def read_manifest(step_dir: str) -> dict[str, dict[str, Any]] | None:
    """The manifest's files, or None when the step has no manifest."""
    path = layout.join(step_dir, layout.MANIFEST)
    if not storage.exists(path):
        return None
    data = storage.read_json_object(path)
    files = data.get("files")
    if not isinstance(files, dict) or not all(
        isinstance(e, dict) and isinstance(e.get("size"), int) and isinstance(e.get("sha256"), str)
        for e in files.values()
    ):
        raise CorruptCheckpointError(
            f"{path}: expected {{'files': {{name: {{size, sha256}}}}}}; the file is damaged"
        )
    return _normalized(step_dir, path, files)


def _normalized(step_dir: str, path: str, files: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The entries keyed by their normal name (`./x`, `././x` and `x//` are `x`), each listed once:
    `verify --deep` hashes a file once however often it is listed. Every name must lie inside the
    step (it is read); one file listed twice with different sizes or hashes is a damaged manifest."""
    normal: dict[str, dict[str, Any]] = {}
    for name, entry in files.items():
        storage.contained(step_dir, name, layout.MANIFEST)
        key = posixpath.normpath(name.replace("\\", "/"))
        if key in (".", ""):
            raise CorruptCheckpointError(
                f"{path} lists {describe(name)}, which names no file; the file is damaged"
            )
        if key in normal and normal[key] != entry:
            raise CorruptCheckpointError(
                f"{path} lists {key} more than once, with different sizes or hashes; the file is damaged"
            )
        normal[key] = entry
    return normal


def manifest_problems(step_dir: str, deep: bool = False, only: str | None = None) -> list[Finding] | None:
    """One finding per listed file that is missing, of another size or (with `deep`) of other bytes;
    `only` limits the check to files under that subdirectory. None when there is no manifest."""
    files = read_manifest(step_dir)
    if files is None:
        return None
    problems = []
    for name, entry in sorted(files.items()):
        if only is not None and not name.startswith(only.rstrip("/") + "/"):
            continue
        path = layout.join(step_dir, name)
        problem = _file_problem(path, entry, deep)
        if problem is not None:
            problems.append(Finding(path, problem))
    return problems


def _file_problem(path: str, entry: dict[str, Any], deep: bool) -> str | None:
    """What is wrong with one listed file, or None when it matches its entry."""
    if not storage.exists(path):
        return f"{path} is missing; the manifest lists it"
    size = storage.size(path)
    if size != entry["size"]:
        return f"{path} has {size} bytes, the manifest says {entry['size']}: the file was changed"
    if deep and _sha256(path) != entry["sha256"]:
        return f"{path}: its bytes differ from the manifest's sha256: the file was changed"
    return None


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with storage.open_regular(path) as handle:
        while block := handle.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def update_manifest(
    step_dir: str, *, removed: str | None = None, rewritten: dict[str, bytes] | None = None
) -> None:
    """Keep a step's manifest true after a conversion: drop the files under `removed` (a relative
    directory) and record the new bytes of `rewritten` (relative name -> bytes written)."""
    files = read_manifest(step_dir)
    if files is None:
        return
    if removed is not None:
        prefix = removed.rstrip("/") + "/"
        files = {name: entry for name, entry in files.items() if not name.startswith(prefix)}
    for name, data in (rewritten or {}).items():
        files[name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    storage.write_json(layout.join(step_dir, layout.MANIFEST), {"version": VERSION, "files": files})
