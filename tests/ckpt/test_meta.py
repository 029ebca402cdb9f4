"""training_step.json: round trip, strict reading, versions and legacy layouts."""

from __future__ import annotations

import json

import pytest

from ckpt_tools.errors import CorruptCheckpointError, LegacyCheckpointError, UnsupportedVersionError
from ckpt_tools.format.meta import FORMAT_VERSION, SamplerPosition, Topology, TrainingStep


def make_step(**overrides):
    fields = dict(
        step=3000,
        dp_world_size=4,
        batch_size=8,
        grad_accum_steps=2,
        mixed_precision="bf16",
        topology=Topology(dp_replicate=2, dp_shard=2),
        checkpoint_format="dcp",
        sampler=SamplerPosition(epoch=1, offset=96),
        seed=7,
    )
    fields.update(overrides)
    return TrainingStep(**fields)


def test_round_trip_is_exact():
    step = make_step()
    assert TrainingStep.from_json(step.to_json()) == step


def test_batch_factorization():
    step = make_step()
    assert step.global_batch_size == 32
    assert step.effective_batch_size == 64


def test_json_holds_the_documented_keys():
    data = json.loads(make_step().to_json())
    for key in (
        "format_version",
        "step",
        "dp_world_size",
        "batch_size",
        "grad_accum_steps",
        "mixed_precision",
        "topology",
        "checkpoint_format",
        "sampler",
    ):
        assert key in data
    assert data["topology"] == {"dp_replicate": 2, "dp_shard": 2, "cp_size": 1, "tp_size": 1}
    assert data["sampler"] == {"epoch": 1, "offset": 96}
    assert data["format_version"] == FORMAT_VERSION


def test_future_version_is_refused():
    data = json.loads(make_step().to_json())
    data["format_version"] = FORMAT_VERSION + 1
    with pytest.raises(UnsupportedVersionError, match="upgrade ckpt-tools"):
        TrainingStep.from_dict(data)


@pytest.mark.parametrize("field", ["step", "batch_size", "topology", "sampler", "checkpoint_format"])
def test_missing_field_is_named(field):
    data = json.loads(make_step().to_json())
    del data[field]
    with pytest.raises(CorruptCheckpointError, match=f"missing field '{field}'"):
        TrainingStep.from_dict(data)


def test_mistyped_field_is_named():
    data = json.loads(make_step().to_json())
    data["batch_size"] = "8"
    with pytest.raises(CorruptCheckpointError, match="'batch_size' should be int"):
        TrainingStep.from_dict(data)


def test_bool_is_not_a_count():
    data = json.loads(make_step().to_json())
    data["step"] = True
    with pytest.raises(CorruptCheckpointError, match="'step' should be int"):
        TrainingStep.from_dict(data)


def test_topology_must_match_world_size():
    with pytest.raises(CorruptCheckpointError, match="dp_world_size=3"):
        make_step(dp_world_size=3)


def test_unknown_format_is_refused():
    with pytest.raises(CorruptCheckpointError, match="checkpoint_format 'zip'"):
        make_step(checkpoint_format="zip")


def test_bad_json_says_damaged():
    with pytest.raises(CorruptCheckpointError, match="not valid JSON"):
        TrainingStep.from_json('{"step": 1')


def test_legacy_file_without_version_is_recognised():
    with pytest.raises(LegacyCheckpointError, match="weights still load"):
        TrainingStep.from_json('{"step": 5000}')
