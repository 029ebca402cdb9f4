"""`ckpt verify`: complete checkpoints pass; damaged ones fail with every problem listed."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from report_fixtures import (
    copy_checkpoint,
    fsdp_checkpoint,
    rewrite_dcp_metadata,
    run_ckpt,
    tiny_model_state,
    write_step_dir,
)
from safetensors.torch import save_file

from ckpt_tools import layout
from ckpt_tools.errors import CheckpointNotFoundError, NotACheckpointError
from ckpt_tools.reports.verify import verify_checkpoint


@pytest.fixture(scope="module")
def fsdp_step(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fsdp_checkpoint(tmp_path_factory)


def model_dir(step_dir: Path) -> Path:
    return step_dir / layout.PRETRAINED_MODEL_DIR


def state_dir(step_dir: Path) -> Path:
    return step_dir / layout.TRAINING_STATE_DIR


def only_problem(step_dir: Path, *fragments: str) -> str:
    report = verify_checkpoint(step_dir)
    assert len(report.problems) == 1, report.problems
    for fragment in fragments:
        assert fragment in report.problems[0], report.problems[0]
    return report.problems[0]


@pytest.mark.parametrize(("fmt", "dp_shard"), [("safetensors", 1), ("dcp", 2), ("safetensors_dcp", 2)])
def test_complete_checkpoints_pass(tmp_path: Path, fmt: str, dp_shard: int) -> None:
    report = verify_checkpoint(write_step_dir(tmp_path, fmt, dp_shard))
    assert report.ok, report.problems
    assert "training_step.json" in report.checked and "rng_state.safetensors" in report.checked


def test_real_fsdp_checkpoint_passes(fsdp_step: Path) -> None:
    report = verify_checkpoint(fsdp_step)
    assert report.ok, report.problems
    assert "pretrained_model/pytorch_model_fsdp_0: chunks" in report.checked
    assert "safetensors and dcp agree" in report.checked
    result = run_ckpt("verify", fsdp_step)
    assert result.exit_code == 0 and result.stdout.startswith("OK: ")


def test_bare_model_dir_and_single_file_pass(tmp_path: Path) -> None:
    save_file(tiny_model_state(), str(tmp_path / layout.MODEL_SAFETENSORS))
    assert verify_checkpoint(tmp_path).ok
    assert verify_checkpoint(tmp_path / layout.MODEL_SAFETENSORS).ok


def test_every_problem_is_listed(fsdp_step: Path, tmp_path: Path) -> None:
    step_dir = copy_checkpoint(fsdp_step, tmp_path)
    shard = model_dir(step_dir) / layout.MODEL_SAFETENSORS
    shard.write_bytes(shard.read_bytes()[:-10])
    distcp = state_dir(step_dir) / layout.OPTIMIZER_DCP_DIR / "__1_0.distcp"
    distcp.write_bytes(distcp.read_bytes()[:100])
    (state_dir(step_dir) / layout.RNG_STATE).unlink()
    (model_dir(step_dir) / layout.POLICY_CONFIG).write_text("{not json")
    report = verify_checkpoint(step_dir)
    assert not report.ok
    problems = "\n".join(report.problems)
    assert f"{shard}: truncated" in problems
    assert "__1_0.distcp is truncated: 100 bytes" in problems
    assert "rng_state.safetensors is missing" in problems
    assert "config.json is not valid JSON" in problems
    assert len(report.problems) == 4, report.problems
    # the CLI lists them all and exits 1
    result = run_ckpt("verify", step_dir)
    assert result.exit_code == 1
    assert "4 problem(s)" in result.stdout
    assert result.stdout.count("\n  - ") == 4
    data = json.loads(run_ckpt("verify", step_dir, "--json").stdout)
    assert data["ok"] is False and len(data["problems"]) == 4


def _edit_chunk(name: str, index: int, **changes: object):  # type: ignore[no-untyped-def]
    def edit(metadata) -> None:  # type: ignore[no-untyped-def]
        chunk = metadata.state_dict_metadata[name].chunks[index]
        for key, value in changes.items():
            setattr(chunk, key, torch.Size(value))

    return edit


@pytest.mark.parametrize(
    ("edit", "fragments"),
    [
        (_edit_chunk("0.weight", 0, sizes=(3, 4)), ["'0.weight' [7, 4]", "gap", "24 of 28"]),
        (_edit_chunk("0.weight", 0, sizes=(5, 4)), ["'0.weight' [7, 4]", "[0, 0] and [4, 0] overlap"]),
    ],
)
def test_chunk_table_problems(fsdp_step: Path, tmp_path: Path, edit, fragments: list[str]) -> None:  # type: ignore[no-untyped-def]
    step_dir = copy_checkpoint(fsdp_step, tmp_path)
    rewrite_dcp_metadata(model_dir(step_dir) / layout.MODEL_DCP_DIR, edit)
    report = verify_checkpoint(step_dir)
    problems = [p for p in report.problems if all(f in p for f in fragments)]
    assert problems, report.problems


def test_chunk_outside_tensor_also_leaves_a_gap(fsdp_step: Path, tmp_path: Path) -> None:
    step_dir = copy_checkpoint(fsdp_step, tmp_path)
    rewrite_dcp_metadata(model_dir(step_dir) / layout.MODEL_DCP_DIR, _edit_chunk("2.bias", 1, sizes=(4,)))
    problems = verify_checkpoint(step_dir).problems
    assert any("lies outside" in p for p in problems) and any("2 of 3 elements" in p for p in problems)


def test_records_sharing_bytes(fsdp_step: Path, tmp_path: Path) -> None:
    step_dir = copy_checkpoint(fsdp_step, tmp_path)

    def edit(metadata) -> None:  # type: ignore[no-untyped-def]
        key = next(k for k in metadata.storage_data if k.fqn == "0.bias" and k.index == 0)
        metadata.storage_data[key] = dataclasses.replace(metadata.storage_data[key], offset=1000)

    rewrite_dcp_metadata(model_dir(step_dir) / layout.MODEL_DCP_DIR, edit)
    only_problem(
        step_dir, "__0_0.distcp: the records of '0.weight' chunk [0, 0] and '0.bias' chunk [0] overlap"
    )


def test_formats_must_agree(tmp_path: Path) -> None:
    step_dir = write_step_dir(tmp_path, "safetensors_dcp", dp_shard=2)
    state = tiny_model_state()
    state["encoder.weight"] = state["encoder.weight"].T.contiguous()  # shape (5, 7)
    state["encoder.bias"] = state["encoder.bias"].double()
    del state["head.count"]
    save_file(state, str(model_dir(step_dir) / layout.MODEL_SAFETENSORS))
    problems = verify_checkpoint(step_dir).problems
    assert sorted(problems) == sorted(
        [
            "'head.count' is in dcp but not in safetensors",
            "'encoder.bias' is F64[7] in safetensors but F32[7] in dcp",
            "'encoder.weight' is F32[5, 7] in safetensors but F32[7, 5] in dcp",
        ]
    )


def test_files_the_format_requires(tmp_path: Path) -> None:
    step_dir = write_step_dir(tmp_path / "a", "safetensors_dcp", dp_shard=2)
    (model_dir(step_dir) / layout.MODEL_SAFETENSORS).unlink()
    only_problem(step_dir, "model.safetensors is missing; checkpoint_format is 'safetensors_dcp'")

    step_dir = write_step_dir(tmp_path / "b", "dcp", dp_shard=2)
    for path in (model_dir(step_dir) / layout.MODEL_DCP_DIR).iterdir():
        path.unlink()
    (model_dir(step_dir) / layout.MODEL_DCP_DIR).rmdir()
    only_problem(step_dir, "pytorch_model_fsdp_0/ is missing; checkpoint_format is 'dcp'")


def test_optimizer_files_follow_the_topology(tmp_path: Path) -> None:
    step_dir = write_step_dir(tmp_path / "sharded", "dcp", dp_shard=2)
    optimizer = state_dir(step_dir) / layout.OPTIMIZER_DCP_DIR
    for path in optimizer.iterdir():
        path.unlink()
    optimizer.rmdir()
    only_problem(step_dir, "optimizer_0/ is missing; a sharded run (FSDP2 2)")

    save_file({"state/w/exp_avg": torch.zeros(2)}, str(state_dir(step_dir) / layout.OPTIMIZER_SAFETENSORS))
    only_problem(step_dir, "gathered optimizer_state.safetensors from a sharded run", "weights still load")

    step_dir = write_step_dir(tmp_path / "single", "safetensors")
    (state_dir(step_dir) / layout.OPTIMIZER_PARAM_GROUPS).unlink()
    only_problem(step_dir, "optimizer_param_groups.json is missing")


def test_missing_dcp_shard_file(fsdp_step: Path, tmp_path: Path) -> None:
    step_dir = copy_checkpoint(fsdp_step, tmp_path)
    (model_dir(step_dir) / layout.MODEL_DCP_DIR / "__1_0.distcp").unlink()
    only_problem(step_dir, "__1_0.distcp is missing; .metadata references it")


def test_sharded_safetensors_index_must_match_its_shards(tmp_path: Path) -> None:
    state = tiny_model_state()
    shard = layout.sharded_model_name(1, 1)
    save_file(state, str(tmp_path / shard))
    weight_map = dict.fromkeys(state, shard)
    del weight_map["head.count"]
    weight_map["ghost"] = shard
    (tmp_path / layout.MODEL_INDEX).write_text(json.dumps({"weight_map": weight_map}))
    problems = verify_checkpoint(tmp_path).problems
    assert any("'ghost' is not in model-00001-of-00001.safetensors" in p for p in problems), problems
    assert any("holds 'head.count', which the index does not list" in p for p in problems), problems


def test_a_damaged_shard_is_named_once(tmp_path: Path) -> None:
    """The group's headers and the index's shard check read the same shard: its damage is one line."""
    state = tiny_model_state()
    shard = tmp_path / layout.sharded_model_name(1, 1)
    save_file(state, str(shard))
    (tmp_path / layout.MODEL_INDEX).write_text(json.dumps({"weight_map": dict.fromkeys(state, shard.name)}))
    shard.write_bytes(shard.read_bytes()[:-4])
    (problem,) = verify_checkpoint(tmp_path).problems
    assert problem.startswith(f"{shard}: truncated"), problem


def test_bad_training_step_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    step_dir = write_step_dir(tmp_path, "safetensors")
    path = state_dir(step_dir) / layout.TRAINING_STEP
    data = json.loads(path.read_text())
    data["format_version"] = 99
    path.write_text(json.dumps(data))
    only_problem(step_dir, "format_version 99 is newer")
    path.unlink()
    only_problem(step_dir, "training_step.json is missing")


def test_nothing_to_verify_raises(tmp_path: Path) -> None:
    with pytest.raises(CheckpointNotFoundError):
        verify_checkpoint(tmp_path / "missing")
    with pytest.raises(NotACheckpointError):
        verify_checkpoint(tmp_path)


def test_every_bad_dcp_file_is_listed(fsdp_step: Path, tmp_path: Path) -> None:
    step_dir = copy_checkpoint(fsdp_step, tmp_path)
    dcp_dir = model_dir(step_dir) / layout.MODEL_DCP_DIR
    (dcp_dir / "__0_0.distcp").unlink()
    (dcp_dir / "__1_0.distcp").write_bytes((dcp_dir / "__1_0.distcp").read_bytes()[:50])
    problems = verify_checkpoint(step_dir).problems
    assert len(problems) == 2, problems
    assert "__0_0.distcp is missing; .metadata references it" in problems[0]
    assert "__1_0.distcp is truncated: 50 bytes" in problems[1]


def _write_processor(model: Path, name: str, steps: list[int]) -> None:
    (model / layout.processor_config_name(name)).write_text(json.dumps({"steps": len(steps)}))
    for index in steps:
        save_file({"mean": torch.zeros(3)}, str(model / layout.processor_step_name(name, index)))


def test_processor_steps_are_numbered_without_gaps(tmp_path: Path) -> None:
    step_dir = write_step_dir(tmp_path, "safetensors")
    model = model_dir(step_dir)
    _write_processor(model, layout.PREPROCESSOR, [0, 1])
    _write_processor(model, layout.POSTPROCESSOR, [])
    report = verify_checkpoint(step_dir)
    assert report.ok, report.problems
    assert "policy_preprocessor_step_1.safetensors" in report.checked

    _write_processor(model, layout.PREPROCESSOR, [0, 3])
    (model / layout.processor_step_name(layout.PREPROCESSOR, 1)).unlink()
    (model / layout.processor_config_name(layout.POSTPROCESSOR)).unlink()
    _write_processor(model, layout.POSTPROCESSOR, [0])
    (model / layout.processor_config_name(layout.POSTPROCESSOR)).unlink()
    problems = verify_checkpoint(step_dir).problems
    assert sorted(problems) == sorted(
        [
            f"{model}/policy_preprocessor_step_1.safetensors is missing: policy_preprocessor steps must be "
            "numbered 0..3 without gaps",
            f"{model}/policy_preprocessor_step_2.safetensors is missing: policy_preprocessor steps must be "
            "numbered 0..3 without gaps",
            f"{model}/policy_postprocessor.json is missing: 1 policy_postprocessor step file(s) have no config",
        ]
    )


def test_damaged_processor_step_file(tmp_path: Path) -> None:
    step_dir = write_step_dir(tmp_path, "safetensors")
    _write_processor(model_dir(step_dir), layout.PREPROCESSOR, [0])
    step_file = model_dir(step_dir) / layout.processor_step_name(layout.PREPROCESSOR, 0)
    step_file.write_bytes(step_file.read_bytes()[:-4])
    only_problem(step_dir, "policy_preprocessor_step_0.safetensors", "truncated")


def test_config_files_must_be_json_objects(tmp_path: Path) -> None:
    step_dir = write_step_dir(tmp_path, "safetensors")
    (model_dir(step_dir) / layout.POLICY_CONFIG).write_text("[1, 2]")
    (model_dir(step_dir) / layout.TRAIN_CONFIG).write_text('"act"')
    (state_dir(step_dir) / layout.OPTIMIZER_PARAM_GROUPS).write_text("{}")
    problems = verify_checkpoint(step_dir).problems
    assert sorted(problems) == sorted(
        [
            f"{model_dir(step_dir)}/config.json must hold an object, not list; the file is damaged",
            f"{model_dir(step_dir)}/train_config.json must hold an object, not str; the file is damaged",
            f"{state_dir(step_dir)}/optimizer_param_groups.json must hold a list, not dict; the file is damaged",
        ]
    )


def test_adapter_files_come_together(tmp_path: Path) -> None:
    step_dir = write_step_dir(tmp_path, "safetensors")
    config = model_dir(step_dir) / layout.ADAPTER_CONFIG
    config.write_text(json.dumps({"peft_type": "LORA"}))
    only_problem(step_dir, "adapter_config.json has no adapter weights beside it")
    save_file(
        {"base_model.model.a.lora_A.weight": torch.zeros(2, 2)},
        str(config.parent / layout.ADAPTER_SAFETENSORS),
    )
    assert verify_checkpoint(step_dir).ok
    config.unlink()
    only_problem(step_dir, "adapter_config.json is missing: adapter weights need their config")


def test_last_of_a_run_must_name_a_complete_step(tmp_path: Path) -> None:
    checkpoints = tmp_path / layout.CHECKPOINTS_DIR
    step_dir = write_step_dir(checkpoints, "safetensors")
    last = checkpoints / layout.LAST
    last.symlink_to(step_dir.name)
    for path in (tmp_path, checkpoints, last):
        report = verify_checkpoint(path)
        assert report.ok and "last names a step directory inside checkpoints/" in report.checked, path
    (state_dir(step_dir) / layout.RNG_STATE).unlink()
    only_problem(tmp_path, "rng_state.safetensors is missing")
    last.unlink()
    last.symlink_to(".tmp-000005")
    only_problem(tmp_path, "'.tmp-000005', which is not a step directory inside")
    result = run_ckpt("verify", tmp_path)
    assert result.exit_code == 1 and "1 problem(s)" in result.stdout
