"""The integrity manifest: every save lists its files with sizes and sha256 digests computed while
writing (every rank's shards included), and `ckpt verify --deep` names every file whose bytes changed:
a flipped byte, a truncated processor file, two files swapped. Steps without a manifest verify as
before, and a save can turn it off."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from report_fixtures import copy_checkpoint, fsdp_checkpoint, run_ckpt

import ckpt_tools
from ckpt_tools import layout
from helpers.tiny_run import make_run, save, train


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A single-process save with two processors whose step files have the same size."""
    model, optimizer, scheduler = make_run()
    train(model, optimizer, scheduler, 2)
    processors = {
        layout.PREPROCESSOR: ckpt_tools.ProcessorState(
            {"steps": ["a", "b"]}, [{"mean": torch.arange(3.0)}, {"mean": torch.arange(3.0) + 1}]
        )
    }
    return Path(
        save(tmp_path_factory.mktemp("manifest"), 2, model, optimizer, scheduler, processors=processors)
    )


def listed(step_dir: Path) -> dict[str, dict[str, object]]:
    return json.loads((step_dir / layout.MANIFEST).read_text())["files"]


def assert_manifest_is_true(step_dir: Path) -> None:
    """Every file of the step is listed (the manifest itself aside), with its real size and digest."""
    files = {str(p.relative_to(step_dir)) for p in step_dir.rglob("*") if p.is_file()} - {layout.MANIFEST}
    entries = listed(step_dir)
    assert set(entries) == files
    for name, entry in entries.items():
        data = (step_dir / name).read_bytes()
        assert entry == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}, name


def deep_problems(step_dir: Path) -> tuple[str, ...]:
    return ckpt_tools.verify_checkpoint(step_dir, deep=True).problems


def test_a_save_lists_every_file_with_its_digest(saved: Path) -> None:
    assert_manifest_is_true(saved)
    assert deep_problems(saved) == ()


def test_every_rank_s_shards_are_listed(tmp_path_factory: pytest.TempPathFactory) -> None:
    step_dir = fsdp_checkpoint(tmp_path_factory)  # 2 gloo ranks, FSDP2, safetensors_dcp
    assert_manifest_is_true(step_dir)
    shards = [name for name in listed(step_dir) if name.endswith(layout.DCP_SHARD_SUFFIX)]
    assert {name.rsplit("/", 1)[-1] for name in shards} >= {"__0_0.distcp", "__1_0.distcp"}
    assert any(name.endswith(layout.DCP_METADATA) for name in listed(step_dir))


def test_a_flipped_byte_is_named_by_deep_verify_only(tmp_path_factory, tmp_path: Path) -> None:
    step_dir = copy_checkpoint(fsdp_checkpoint(tmp_path_factory), tmp_path, manifest=True)
    shard = step_dir / layout.PRETRAINED_MODEL_DIR / layout.MODEL_DCP_DIR / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    assert ckpt_tools.verify_checkpoint(step_dir).ok  # sizes and metadata cannot see it
    (problem,) = deep_problems(step_dir)
    assert str(shard) in problem and "sha256" in problem
    result = run_ckpt("verify", step_dir, "--deep")
    assert result.exit_code == 1 and str(shard) in result.stdout


def test_a_truncated_processor_file_and_a_swap_are_named(saved: Path, tmp_path: Path) -> None:
    step_dir = Path(shutil.copytree(saved, tmp_path / saved.name))
    model_dir = step_dir / layout.PRETRAINED_MODEL_DIR
    first, second = (model_dir / layout.processor_step_name(layout.PREPROCESSOR, i) for i in (0, 1))
    a, b = first.read_bytes(), second.read_bytes()
    assert len(a) == len(b)
    first.write_bytes(b)
    second.write_bytes(a)
    assert ckpt_tools.verify_checkpoint(step_dir).ok  # both still valid files of the right size
    problems = deep_problems(step_dir)
    assert (
        len(problems) == 2
        and str(first) in problems[0] + problems[1]
        and str(second) in problems[0] + problems[1]
    )
    first.write_bytes(b[:-4])
    assert any(str(first) in p for p in ckpt_tools.verify_checkpoint(step_dir).problems)


def test_without_a_manifest_verify_is_as_before(saved: Path, tmp_path: Path) -> None:
    step_dir = Path(shutil.copytree(saved, tmp_path / saved.name))
    (step_dir / layout.MANIFEST).unlink()
    assert ckpt_tools.verify_checkpoint(step_dir, deep=True).ok


def test_the_manifest_can_be_turned_off(tmp_path: Path) -> None:
    model, optimizer, scheduler = make_run()
    step_dir = Path(save(tmp_path, 1, model, optimizer, scheduler, manifest=False))
    assert not (step_dir / layout.MANIFEST).exists()
    assert ckpt_tools.verify_checkpoint(step_dir, deep=True).ok


def test_delete_dcp_keeps_the_manifest_true(tmp_path_factory, tmp_path: Path) -> None:
    step_dir = copy_checkpoint(fsdp_checkpoint(tmp_path_factory), tmp_path, manifest=True)
    result = run_ckpt("convert", step_dir, "--delete-dcp", "--overwrite")
    assert result.exit_code == 0, result.stderr
    report = ckpt_tools.verify_checkpoint(step_dir, deep=True)
    assert report.ok, report.problems
    assert not any(layout.MODEL_DCP_DIR in name for name in listed(step_dir))


def test_a_file_listed_400_times_is_hashed_once(saved: Path, tmp_path: Path, monkeypatch) -> None:
    """`./x`, `././x`, ... are one file: listed once after normalizing, hashed once by --deep."""
    from ckpt_tools.files import manifest

    step_dir = tmp_path / "step"
    shutil.copytree(saved, step_dir)
    entries = listed(step_dir)
    name = f"{layout.PRETRAINED_MODEL_DIR}/{layout.MODEL_SAFETENSORS}"
    entries.update({"./" * i + name: entries[name] for i in range(1, 400)})
    (step_dir / layout.MANIFEST).write_text(json.dumps({"version": 1, "files": entries}))
    hashed: list[str] = []
    real = manifest._sha256
    monkeypatch.setattr(manifest, "_sha256", lambda path: hashed.append(path) or real(path))
    assert deep_problems(step_dir) == ()
    assert sum(path.endswith(name) for path in hashed) == 1
    entries["././" + name] = {"size": 1, "sha256": "0" * 64}  # the same file, another record
    (step_dir / layout.MANIFEST).write_text(json.dumps({"version": 1, "files": entries}))
    (problem,) = deep_problems(step_dir)
    assert f"lists {name} more than once, with different sizes or hashes" in problem


def _model_weights(step_dir: Path) -> Path:
    return step_dir / layout.PRETRAINED_MODEL_DIR / layout.MODEL_SAFETENSORS


def test_a_file_two_checks_find_fault_with_is_named_once(saved: Path, tmp_path: Path) -> None:
    """A truncated model.safetensors fails its header check and the manifest's size check: the report
    names it once, by the header check (the manifest skips a file already reported, by its path)."""
    step_dir = Path(shutil.copytree(saved, tmp_path / saved.name))
    weights = _model_weights(step_dir)
    weights.write_bytes(weights.read_bytes()[:-10])
    (problem,) = deep_problems(step_dir)
    assert problem.startswith(f"{weights}: truncated"), problem


def test_a_longer_file_name_does_not_hide_a_changed_file(saved: Path, tmp_path: Path) -> None:
    """`model.safetensors.index.json`'s problem contains the text of `model.safetensors`' path, yet is
    about another file: the manifest still names the changed `model.safetensors`."""
    step_dir = Path(shutil.copytree(saved, tmp_path / saved.name))
    weights = _model_weights(step_dir)
    index = weights.parent / layout.MODEL_INDEX
    index.write_text(json.dumps({"weight_map": {"ghost": layout.MODEL_SAFETENSORS}}))
    entries = listed(step_dir)
    entries[f"{layout.PRETRAINED_MODEL_DIR}/{layout.MODEL_SAFETENSORS}"]["size"] += 1
    (step_dir / layout.MANIFEST).write_text(json.dumps({"version": 1, "files": entries}))
    problems = ckpt_tools.verify_checkpoint(step_dir).problems
    assert any(p.startswith(f"{index}: 'ghost' is not in") for p in problems), problems
    assert any(p.startswith(f"{weights} has ") and "the manifest says" in p for p in problems), problems
