"""Hostile and careless inputs: each case builds the smallest file that used to hang a reader, exhaust
its memory, read outside the checkpoint, lose data or print a traceback, then runs the real command in a
fresh process under an address-space limit and a timeout. Every case asserts: a non-zero exit with one
`error:` line naming the problem (or `ckpt verify`'s FAILED list), no traceback, no byte of a file
outside the checkpoint in anything written, and the input tree unchanged."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from hostile_fixtures import (
    SENTINEL,
    SelfReferencingLayout,
    adapter_pair,
    dcp_dir,
    edited_dcp,
    files_holding_marker,
    first_chunk,
    first_record,
    garbage_only_metadata,
    long_opcodes,
    model_dir,
    nested_list_opcodes,
    raw_dcp,
    raw_safetensors,
    run_bounded,
    secret,
    secret_safetensors,
    set_field,
    small_dcp,
    step_with_training_step,
    tree_state,
    write_metadata,
)
from report_fixtures import dcp_save
from safetensors.torch import load_file, save_file

from ckpt_tools import layout

ERROR = "error"  # one `error:` line on stderr, exit 1
FAILED = "verify"  # `ckpt verify` exit 1, the problem listed on stdout


@dataclass(frozen=True)
class Case:
    build: Callable[[Path], list[str]]  # writes the input, returns the command's arguments
    mode: str
    fragment: str


CASES: dict[str, Case] = {}


def case(name: str, mode: str, fragment: str):  # type: ignore[no-untyped-def]
    def register(build: Callable[[Path], list[str]]) -> Callable[[Path], list[str]]:
        CASES[name] = Case(build, mode, fragment)
        return build

    return register


# --- reads outside the checkpoint ---------------------------------------------------------------


def _traversal(tmp: Path) -> Path:
    secret(tmp)
    raw_dcp(dcp_dir(tmp), (4, 4), [((0, 0), (4, 4))], relative_path="../../../outside/secret.bin")
    return model_dir(tmp)


@case("dcp relative_path ../ verify", FAILED, "outside its directory")
def _dcp_traversal_verify(tmp: Path) -> list[str]:
    return ["verify", str(_traversal(tmp))]


@case("dcp relative_path ../ convert", ERROR, "names '../../../outside/secret.bin', outside its directory")
def _dcp_traversal_convert(tmp: Path) -> list[str]:
    return ["convert", str(_traversal(tmp))]


@case("dcp relative_path absolute convert", ERROR, "outside its directory")
def _dcp_absolute(tmp: Path) -> list[str]:
    path = secret(tmp)
    raw_dcp(dcp_dir(tmp), (4, 4), [((0, 0), (4, 4))], relative_path=str(path))
    return ["convert", str(model_dir(tmp))]


@case("distcp symlink leading outside convert", ERROR, "a link leading outside the directory")
def _distcp_symlink(tmp: Path) -> list[str]:
    path = secret(tmp)
    directory = dcp_dir(tmp)
    raw_dcp(directory, (4, 4), [((0, 0), (4, 4))])
    (directory / "__0_0.distcp").unlink()
    (directory / "__0_0.distcp").symlink_to(path)
    return ["convert", str(model_dir(tmp))]


# --- bounded time and memory --------------------------------------------------------------------


def _fifo_metadata(tmp: Path) -> Path:
    directory, _ = small_dcp(tmp)
    (directory / layout.DCP_METADATA).unlink()
    os.mkfifo(directory / layout.DCP_METADATA)
    return model_dir(tmp)


for _command in ("inspect", "verify", "convert", "load"):
    case(
        f".metadata FIFO {_command}",
        FAILED if _command == "verify" else ERROR,
        "is a FIFO, not a regular file",
    )(lambda tmp, command=_command: [command, str(_fifo_metadata(tmp))])


@case(".metadata symlink to /dev/zero inspect", ERROR, "is a link leading outside the directory")
def _dev_zero(tmp: Path) -> list[str]:
    directory, _ = small_dcp(tmp)
    (directory / layout.DCP_METADATA).unlink()
    (directory / layout.DCP_METADATA).symlink_to("/dev/zero")
    return ["inspect", str(model_dir(tmp))]


@case("self-referencing list passed to _get_layout", ERROR, "refused layout argument a list of 1 items")
def _self_reference(tmp: Path) -> list[str]:
    directory, _ = small_dcp(tmp)
    (directory / layout.DCP_METADATA).write_bytes(pickle.dumps({"x": SelfReferencingLayout()}))
    return ["inspect", str(model_dir(tmp))]


@case("deflated chunk record convert", ERROR, "is compressed; torch.save stores records uncompressed")
def _compressed_record(tmp: Path) -> list[str]:
    directory = dcp_dir(tmp)
    dcp_save({"w": torch.zeros(1024, 1024)}, directory)  # 4 MiB of zeros, deflated to a few KB below
    shard = directory / "__0_0.distcp"
    with zipfile.ZipFile(shard) as plain:
        entries = [(info.filename, plain.read(info)) for info in plain.infolist()]
    with zipfile.ZipFile(shard, "w", zipfile.ZIP_DEFLATED) as deflated:
        for name, data in entries:
            deflated.writestr(name, data)
    metadata = pickle.loads((directory / layout.DCP_METADATA).read_bytes())
    set_field(first_record(metadata), "length", shard.stat().st_size)
    (directory / layout.DCP_METADATA).write_bytes(pickle.dumps(metadata))
    return ["convert", str(model_dir(tmp))]


@case("overlapping chunks whose counts add up convert", ERROR, "chunks at offsets [0, 0] and [3, 0] overlap")
def _overlap_adds_up(tmp: Path) -> list[str]:
    raw_dcp(dcp_dir(tmp), (7, 4), [((0, 0), (4, 4)), ((3, 0), (3, 4))])
    return ["convert", str(model_dir(tmp))]


@case("20,000 chunks all overlapping verify", FAILED, "... and 19979 more overlapping pairs")
def _many_overlapping_chunks(tmp: Path) -> list[str]:
    n = 20_000
    raw_dcp(dcp_dir(tmp), (4, n), [((0, i), (4, n - i)) for i in range(n)], record_length=16)
    return ["verify", str(model_dir(tmp))]


# --- malformed .metadata fields -----------------------------------------------------------------


@case(".metadata chunk offsets a string", ERROR, "has a chunk offset 'ab', not a tuple")
def _offsets_string(tmp: Path) -> list[str]:
    return ["inspect", str(edited_dcp(tmp, lambda m: set_field(first_chunk(m), "offsets", "ab")))]


@case(".metadata chunk sizes None", ERROR, "has a chunk size None, not a tuple")
def _sizes_none(tmp: Path) -> list[str]:
    return ["inspect", str(edited_dcp(tmp, lambda m: set_field(first_chunk(m), "sizes", None)))]


@case(".metadata storage key an integer", ERROR, "a storage record is keyed by None, not a name")
def _storage_key_int(tmp: Path) -> list[str]:
    def edit(metadata):  # type: ignore[no-untyped-def]
        metadata.storage_data[7] = metadata.storage_data.pop(next(iter(metadata.storage_data)))

    return ["inspect", str(edited_dcp(tmp, edit))]


@case(".metadata record offset 2**70 convert", ERROR, "not a byte range a file can hold")
def _offset_overflow(tmp: Path) -> list[str]:
    return ["convert", str(edited_dcp(tmp, lambda m: set_field(first_record(m), "offset", 2**70)))]


@case(".metadata record length of 5,000 digits verify", FAILED, "a 16610-bit integer")
def _length_digits(tmp: Path) -> list[str]:
    path = edited_dcp(tmp, lambda m: set_field(first_record(m), "length", SENTINEL), long_opcodes(10**5000))
    return ["verify", str(path)]


@case(".metadata dtype nested 100,000 deep", ERROR, "has dtype a list of 1 items, which safetensors cannot")
def _deep_dtype(tmp: Path) -> list[str]:
    def edit(metadata):  # type: ignore[no-untyped-def]
        metadata.state_dict_metadata["w"].properties.dtype = SENTINEL

    return ["inspect", str(edited_dcp(tmp, edit, nested_list_opcodes(100_000)))]


@case(".metadata tensor size a list of lists", ERROR, "has shape a list of 2 items, not a tuple")
def _size_lists(tmp: Path) -> list[str]:
    def edit(metadata):  # type: ignore[no-untyped-def]
        set_field(metadata.state_dict_metadata["w"], "size", [[1], [2]])

    return ["inspect", str(edited_dcp(tmp, edit))]


# --- safetensors headers -------------------------------------------------------------------------


@case("safetensors header nested 100,000 deep", ERROR, "the header nests JSON too deeply")
def _deep_header(tmp: Path) -> list[str]:
    header = b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    return ["inspect", str(raw_safetensors(model_dir(tmp) / layout.MODEL_SAFETENSORS, header))]


@case("safetensors shape of 5,000 digits", ERROR, "the header holds a value out of range")
def _header_digits(tmp: Path) -> list[str]:
    header = b'{"a":{"dtype":"F32","shape":[1' + b"0" * 5000 + b'],"data_offsets":[0,4]}}'
    return ["inspect", str(raw_safetensors(model_dir(tmp) / layout.MODEL_SAFETENSORS, header))]


@case("safetensors dtype a list", ERROR, "unknown dtype ['F32']")
def _header_list_dtype(tmp: Path) -> list[str]:
    header = b'{"a":{"dtype":["F32"],"shape":[1],"data_offsets":[0,4]}}'
    return ["inspect", str(raw_safetensors(model_dir(tmp) / layout.MODEL_SAFETENSORS, header))]


# --- training_step.json --------------------------------------------------------------------------

for _name, _fields, _fragment in (
    ("negative step", {"step": -3}, "step is -3, outside 0.."),
    ("negative sampler offset", {"sampler.offset": -1}, "sampler.offset is -1, outside 0.."),
    ("huge epoch", {"sampler.epoch": 10**30}, "sampler.epoch is a 100-bit integer, outside 0..2147483647"),
    ("zero dp_shard", {"topology.dp_shard": 0, "dp_world_size": 0}, "topology.dp_shard is 0, outside 1.."),
    ("zero batch_size", {"batch_size": 0}, "batch_size is 0, outside 1.."),
):
    case(f"training_step.json {_name} verify", FAILED, _fragment)(
        lambda tmp, fields=_fields: ["verify", str(step_with_training_step(tmp, **fields))]
    )


@case("training_step.json nested 100,000 deep inspect", ERROR, "nests JSON too deeply")
def _deep_training_step(tmp: Path) -> list[str]:
    return ["inspect", str(step_with_training_step(tmp, text="[" * 100_000 + "]" * 100_000))]


@case("training_step.json step of 5,000 digits verify", FAILED, "holds a value JSON cannot carry here")
def _training_step_digits(tmp: Path) -> list[str]:
    return [
        "verify",
        str(step_with_training_step(tmp, text='{"format_version": 1, "step": 1' + "0" * 5000 + "}")),
    ]


@case("step directory name with a trailing newline verify", FAILED, "which is not a step directory")
def _step_name_newline(tmp: Path) -> list[str]:
    step_dir = step_with_training_step(tmp)
    step_dir.rename(step_dir.with_name("000005\n"))
    (step_dir.parent / layout.LAST).symlink_to("000005\n")
    return ["verify", str(step_dir.parent)]


# --- merge-adapter -------------------------------------------------------------------------------

for _name, _config, _fragment in (
    ("lora_alpha a string", {"lora_alpha": "16"}, "lora_alpha is '16', not a finite number"),
    (
        "rank_pattern not a regex",
        {"rank_pattern": {"q[": 4}},
        "rank_pattern key 'q[' is not a regular expression",
    ),
):
    case(f"merge-adapter {_name}", ERROR, _fragment)(
        lambda tmp, config=_config: [
            "merge-adapter",
            str(adapter_pair(tmp, **config)),
            "-o",
            str(tmp / "merged"),
        ]
    )
    case(f"verify adapter {_name}", FAILED, _fragment)(
        lambda tmp, config=_config: ["verify", str(adapter_pair(tmp, **config))]
    )

case("merge-adapter rank 0", ERROR, "has rank 0 (lora_A has no rows)")(
    lambda tmp: ["merge-adapter", str(adapter_pair(tmp, rank=0, r=2)), "-o", str(tmp / "merged")]
)
case("verify adapter r 0", FAILED, "r is 0, not a positive integer rank")(
    lambda tmp: ["verify", str(adapter_pair(tmp, rank=0))]
)


@case("DCP directory whose only entry is garbage load", ERROR, "holds no tensors")
def _garbage_only(tmp: Path) -> list[str]:
    directory, _ = small_dcp(tmp)
    write_metadata(directory, garbage_only_metadata())
    return ["load", str(model_dir(tmp))]


# --- files a checkpoint names, outside it -------------------------------------------------------


def _index_naming(tmp: Path, shard: str) -> Path:
    model = model_dir(tmp)
    (model / layout.MODEL_INDEX).write_text(json.dumps({"metadata": {}, "weight_map": {"w": shard}}))
    return model


def _index_outside(tmp: Path) -> Path:
    secret_safetensors(tmp)
    return _index_naming(tmp, "../../outside/secret.safetensors")


for _command in ("inspect", "verify", "load", "convert --to dcp"):
    case(
        f"index weight_map ../ {_command}",
        FAILED if _command == "verify" else ERROR,
        "names '../../outside/secret.safetensors', outside its directory",
    )(lambda tmp, command=_command: [*command.split(), str(_index_outside(tmp))])


@case("index weight_map absolute inspect", ERROR, "outside its directory")
def _index_absolute(tmp: Path) -> list[str]:
    return ["inspect", str(_index_naming(tmp, str(secret_safetensors(tmp))))]


def _step_linked_outside(tmp: Path) -> Path:
    """checkpoints/000005 is a link to a complete step elsewhere, and last names it."""
    outside = step_with_training_step(tmp / "outside")
    shutil.copy(secret_safetensors(tmp), outside / layout.PRETRAINED_MODEL_DIR / layout.MODEL_SAFETENSORS)
    checkpoints = tmp / "ckpt" / "run" / layout.CHECKPOINTS_DIR
    checkpoints.mkdir(parents=True)
    (checkpoints / "000005").symlink_to(outside)
    (checkpoints / layout.LAST).symlink_to("000005")
    return tmp / "ckpt" / "run"


for _command in ("inspect", "verify", "load"):
    case(
        f"step directory linked outside checkpoints/ {_command}",
        FAILED if _command == "verify" else ERROR,
        "which is a link leading outside the directory",
    )(lambda tmp, command=_command: [command, str(_step_linked_outside(tmp))])


def _run_with_last(tmp: Path, make: Callable[[Path], None]) -> Path:
    """A run whose one complete step is 000005 and whose `checkpoints/last` is what `make` puts there."""
    checkpoints = tmp / "ckpt" / "run" / layout.CHECKPOINTS_DIR
    checkpoints.mkdir(parents=True)
    shutil.move(step_with_training_step(tmp / "steps"), checkpoints / "000005")
    make(checkpoints / layout.LAST)
    return checkpoints.parent


def _sparse_text(path: Path) -> None:
    with path.open("wb") as handle:
        handle.write(b"000005")
        handle.truncate(2 << 30)  # 2 GB of text (a sparse file: nothing is written)


_BROKEN_LAST: dict[str, tuple[Callable[[Path], None], str]] = {
    "a FIFO": (os.mkfifo, "is a FIFO, not a regular file"),
    "a directory": (lambda path: path.mkdir(), "is a directory, not a pointer"),
    "a link to itself": (lambda path: path.symlink_to(layout.LAST), "points to 'last', which is not a step"),
    "a link to a missing step": (
        lambda path: path.symlink_to("000009"),
        "names 000009, which does not exist",
    ),
    "invalid UTF-8": (lambda path: path.write_bytes(b"\xff\xfe0005"), "holds bytes that are not text"),
    "a 2 GB text file": (_sparse_text, "is larger than 4096 bytes"),
}
for _kind, (_make, _fragment) in _BROKEN_LAST.items():
    for _command in ("inspect", "verify") if _kind in ("a FIFO", "a directory") else ("inspect",):
        case(f"checkpoints/last {_kind} {_command}", FAILED if _command == "verify" else ERROR, _fragment)(
            lambda tmp, command=_command, make=_make: [command, str(_run_with_last(tmp, make))]
        )


case(
    "training_step.json step 999 inside 000005 verify",
    FAILED,
    "records step 999 inside the step directory 000005",
)(lambda tmp: ["verify", str(step_with_training_step(tmp, step=999))])


def _linked_out(tmp: Path, *parts: str) -> Path:
    """A step directory whose entry at `parts` (a file or a directory) is a link to a copy outside."""
    step_dir = step_with_training_step(tmp)
    inside = step_dir.joinpath(*parts)
    outside = tmp / "outside" / parts[-1]
    outside.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(inside, outside)
    inside.symlink_to(outside)
    return step_dir


_LINKED = {
    "model.safetensors": (layout.PRETRAINED_MODEL_DIR, layout.MODEL_SAFETENSORS),
    "training_state/": (layout.TRAINING_STATE_DIR,),
}
for _what, _parts in _LINKED.items():
    for _command in ("inspect", "verify", "load", "diff", "push"):
        case(
            f"{_what} a link leading outside the step {_command}",
            ERROR,  # verify too: the directory is refused before any file is checked
            "is a link leading outside the directory",
        )(
            lambda tmp, command=_command, parts=_parts: [
                command,
                str(_linked_out(tmp, *parts)),
                *([str(tmp / "ckpt" / "000005")] if command == "diff" else []),
                *([str(tmp / "published")] if command == "push" else []),
            ]
        )


def _fifo_in_step(tmp: Path, *parts: str) -> Path:
    """A step directory whose file at `parts` is replaced by a FIFO (a read of it would block)."""
    step_dir = step_with_training_step(tmp)
    step_dir.joinpath(*parts).unlink()
    os.mkfifo(step_dir.joinpath(*parts))
    return step_dir


case("training_step.json a FIFO inspect", ERROR, "is a FIFO, not a regular file")(
    lambda tmp: ["inspect", str(_fifo_in_step(tmp, layout.TRAINING_STATE_DIR, layout.TRAINING_STEP))]
)
case("model.safetensors a FIFO verify", FAILED, "is a FIFO, not a regular file")(
    lambda tmp: ["verify", str(_fifo_in_step(tmp, layout.PRETRAINED_MODEL_DIR, layout.MODEL_SAFETENSORS))]
)


@case("index nested 100,000 deep inspect", ERROR, "nests JSON too deeply")
def _deep_index(tmp: Path) -> list[str]:
    (model_dir(tmp) / layout.MODEL_INDEX).write_text("[" * 100_000 + "]" * 100_000)
    return ["inspect", str(model_dir(tmp))]


@case("manifest.json listing ../ verify --deep", FAILED, "names '../../outside/secret.bin', outside its")
def _manifest_outside(tmp: Path) -> list[str]:
    secret(tmp)
    step_dir = step_with_training_step(tmp)
    entry = {"size": 64, "sha256": "0" * 64}
    (step_dir / layout.MANIFEST).write_text(
        json.dumps({"version": 1, "files": {"../../outside/secret.bin": entry}})
    )
    return ["verify", "--deep", str(step_dir)]


@case(
    "manifest.json naming a lone surrogate verify --deep", FAILED, "which is not valid text for a file name"
)
def _manifest_surrogate(tmp: Path) -> list[str]:
    step_dir = step_with_training_step(tmp)
    (step_dir / layout.MANIFEST).write_text(
        '{"version": 1, "files": {"\\ud800": {"size": 1, "sha256": "00"}}}'
    )
    return ["verify", "--deep", str(step_dir)]


def _surrogate_tensor(tmp: Path) -> Path:
    model = model_dir(tmp)
    header = b'{"\\ud800": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}'
    raw_safetensors(model / layout.MODEL_SAFETENSORS, header)
    return model


for _command in ("verify", "inspect --tensors", "diff", "load"):
    case(
        f"tensor named by a lone surrogate {_command}",
        FAILED if _command == "verify" else ERROR,
        "the header holds the name '\\ud800', which is not valid text",
    )(
        lambda tmp, command=_command: [
            *command.split(),
            str(_surrogate_tensor(tmp)),
            *([str(_surrogate_tensor(tmp))] if command == "diff" else []),
        ]
    )


@case(
    "safetensors shape of 1000 dimensions load", ERROR, "is not a list of non-negative integers (at most 64)"
)
def _thousand_dims(tmp: Path) -> list[str]:
    header = json.dumps({"w": {"dtype": "F32", "shape": [1] * 1000, "data_offsets": [0, 4]}}).encode()
    raw_safetensors(model_dir(tmp) / layout.MODEL_SAFETENSORS, header)
    return ["load", str(model_dir(tmp))]


# --- data loss in convert -------------------------------------------------------------------------


def _bare_dcp(tmp: Path) -> Path:
    """A DCP directory on its own (not in a step, whose own rules refuse any --output with --delete-dcp)."""
    directory = tmp / "ckpt" / "shards"
    raw_dcp(directory, (4, 4), [((0, 0), (4, 4))])
    return directory


@case("convert --output inside the DCP dir --delete-dcp", ERROR, "lies inside")
def _output_inside_deleted(tmp: Path) -> list[str]:
    directory = _bare_dcp(tmp)
    return ["convert", str(directory), "--output", str(directory / "out"), "--delete-dcp"]


@case("convert --output inside the DCP dir --delete-dcp --push-to-hub", ERROR, "lies inside")
def _output_inside_pushed(tmp: Path) -> list[str]:
    directory = _bare_dcp(tmp)
    target = f"file://{tmp / 'merged'}"
    return ["convert", str(directory), "-o", str(directory), "--delete-dcp", "--push-to-hub", target]


def _safetensors_model(tmp: Path) -> Path:
    model = model_dir(tmp)
    save_file({"w": torch.arange(6.0)}, str(model / layout.MODEL_SAFETENSORS))
    return model


@case("convert --to dcp --overwrite onto the input model dir", ERROR, "lies inside")
def _to_dcp_onto_input(tmp: Path) -> list[str]:
    model = _safetensors_model(tmp)
    return ["convert", str(model), "--to", "dcp", "--output", str(model), "--overwrite"]


@case("convert --to dcp --overwrite onto a dir holding the input", ERROR, "lies inside")
def _to_dcp_onto_parent(tmp: Path) -> list[str]:
    model = _safetensors_model(tmp)
    return ["convert", str(model), "--to", "dcp", "--output", str(model.parent), "--overwrite"]


# --- the test ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_input_is_refused_in_bounds(tmp_path: Path, name: str) -> None:
    hostile = CASES[name]
    args = hostile.build(tmp_path)
    before = tree_state(tmp_path / "ckpt")
    result = run_bounded(args, cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-2000:]
    assert "Traceback" not in output, output[-2000:]
    if hostile.mode == ERROR:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), output[-2000:]
        assert hostile.fragment in lines[0], lines[0]
    else:
        assert result.stdout.startswith("FAILED: "), output[-2000:]
        assert hostile.fragment in " ".join(result.stdout.split()), result.stdout[-2000:]
        assert len(result.stdout.splitlines()) < 50
    assert tree_state(tmp_path / "ckpt") == before
    assert not (tmp_path / "merged").exists()
    assert files_holding_marker(tmp_path / "ckpt") == []


def test_twenty_thousand_chunks_verify_quickly(tmp_path: Path) -> None:
    """The case that took 274 s: 20,000 chunks split along an inner dimension, which a pairwise
    overlap check compares all with all. A correct tiling verifies OK well inside the timeout."""
    n = 20_000
    raw_dcp(dcp_dir(tmp_path), (4, n), [((0, i), (4, 1)) for i in range(n)])
    result = run_bounded(["verify", str(model_dir(tmp_path))], cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.startswith("OK: "), result.stdout + result.stderr


def test_to_dcp_overwrite_replaces_only_dcp_files(tmp_path: Path) -> None:
    """--overwrite into an unrelated existing directory writes the DCP files beside what is there,
    replacing only an older DCP save's files."""
    model = _safetensors_model(tmp_path)
    out = tmp_path / "elsewhere"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    (out / "__7_0.distcp").write_bytes(b"an older save's shard")
    result = run_bounded(["convert", str(model), "--to", "dcp", "-o", str(out), "--overwrite"], cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (out / "notes.txt").read_text() == "keep me"
    assert not (out / "__7_0.distcp").exists() and (out / layout.DCP_METADATA).is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")] == []


def test_full_disk_leaves_no_temporary_file(tmp_path: Path) -> None:
    """A write that fails mid-file (the file-size limit stands in for a full disk) is one line, and
    the temporary file is removed even though flushing it fails again during the cleanup."""
    directory = dcp_dir(tmp_path)
    raw_dcp(directory, (64, 256), [((0, 0), (32, 256)), ((32, 0), (32, 256))])
    out = tmp_path / "out"
    out.mkdir()
    before = tree_state(tmp_path / "ckpt")
    result = run_bounded(
        ["convert", str(model_dir(tmp_path)), "-o", str(out)], cwd=tmp_path, file_limit=16384
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1 and "File too large" in lines[0], result.stderr
    assert list(out.iterdir()) == []
    assert tree_state(tmp_path / "ckpt") == before


def test_brackets_in_paths_are_printed(tmp_path: Path) -> None:
    """rich markup would swallow `[bold]` in a path; convert prints it as it is."""
    directory = tmp_path / "run[bold]x" / layout.MODEL_DCP_DIR
    raw_dcp(directory, (4, 4), [((0, 0), (4, 4))])
    result = run_bounded(["convert", str(directory.parent)], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"wrote {directory.parent / layout.MODEL_SAFETENSORS}" in result.stdout
    assert load_file(str(directory.parent / layout.MODEL_SAFETENSORS))["w"].shape == (4, 4)


def test_trainer_console_prints_brackets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trainer.reporting.metrics import MetricsLogger

    logger = MetricsLogger(str(tmp_path / "out[bold]"), total_steps=1, start_step=0)
    logger.note(f"saved {tmp_path}/out[bold]/checkpoints/000001")
    assert "out[bold]/checkpoints/000001" in capsys.readouterr().err


def test_a_tiny_convert_runs_under_a_400_mb_address_space(tmp_path: Path) -> None:
    """Reading a 2 kB `.metadata` under its 512 MiB limit allocated the limit, not the file (a
    MemoryError under 400 MB); it reads what the file holds."""
    raw_dcp(dcp_dir(tmp_path), (4, 4), [((0, 0), (4, 4))])
    result = run_bounded(["convert", str(model_dir(tmp_path))], cwd=tmp_path, memory_limit=400 << 20)
    assert result.returncode == 0, result.stdout + result.stderr


def test_running_out_of_memory_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """A MemoryError anywhere in a command (a limit below what it needed) is one `error:` line."""
    from ckpt_tools.cli.errors import run_guarded

    def needs_too_much() -> None:
        raise MemoryError

    with pytest.raises(SystemExit) as exited:
        run_guarded(needs_too_much)
    lines = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 1
    assert len(lines) == 1 and lines[0].startswith("error: out of memory: "), lines


def test_deep_verify_of_a_bare_dcp_directory_checks_every_record_s_crc(tmp_path: Path) -> None:
    """No manifest hashes a bare DCP directory: `verify --deep` reads every record as conversion
    does (zip structure) and checks each entry's CRC-32, so a flipped data byte is named; plain
    `verify` (sizes and metadata) cannot see it."""
    directory = tmp_path / "ckpt" / "shards"
    dcp_save({"w": torch.arange(16384, dtype=torch.float32)}, directory)
    (record,) = directory.glob("*.distcp")
    data = bytearray(record.read_bytes())
    data[len(data) // 2] ^= 0x01
    record.write_bytes(bytes(data))
    assert run_bounded(["verify", str(directory)], cwd=tmp_path).returncode == 0
    result = run_bounded(["verify", "--deep", str(directory)], cwd=tmp_path)
    assert result.returncode == 1 and result.stdout.startswith("FAILED: "), result.stdout + result.stderr
    assert f"{record.name} (a chunk of 'w'): chunk record is damaged (Bad CRC-32" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr
