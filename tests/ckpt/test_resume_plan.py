"""Phase-1 resume plans: what is sample-exact, what is warned, what is refused."""

from __future__ import annotations

import dataclasses

import pytest

from ckpt_tools.errors import ResumeRefusedError
from ckpt_tools.format.meta import SamplerPosition, Topology, TrainingStep
from ckpt_tools.state.resume_plan import RunShape, plan_resume

SAVED = TrainingStep(
    step=30,
    dp_world_size=4,
    batch_size=2,
    grad_accum_steps=1,
    mixed_precision="no",
    topology=Topology(dp_replicate=1, dp_shard=4),
    checkpoint_format="dcp",
    sampler=SamplerPosition(epoch=2, offset=16),
)


def test_same_run_is_exact_and_silent():
    plan = plan_resume(
        SAVED, RunShape(Topology(1, 4), batch_size=2, grad_accum_steps=1, mixed_precision="no")
    )
    assert plan.sample_exact and not plan.reshard
    assert plan.changes == () and plan.warning is None
    assert plan.step == 30 and plan.sampler == SamplerPosition(2, 16)


def test_fewer_ranks_with_same_global_batch_is_exact_but_reported():
    plan = plan_resume(
        SAVED, RunShape(Topology(1, 2), batch_size=4, grad_accum_steps=1, mixed_precision="no")
    )
    assert plan.sample_exact and plan.reshard
    assert "topology FSDP2 4 -> FSDP2 2" in plan.warning
    assert "batch_size 2 -> 4" in plan.warning
    assert "data order is unchanged" in plan.warning


def test_changed_global_batch_warns_about_exactness():
    plan = plan_resume(
        SAVED, RunShape(Topology(2, 1), batch_size=2, grad_accum_steps=1, mixed_precision="no")
    )
    assert not plan.sample_exact
    assert "effective batch 8 -> 4" in plan.warning
    assert "differ from the uninterrupted run" in plan.warning


def test_hsdp_topology_change_is_described():
    plan = plan_resume(
        SAVED, RunShape(Topology(2, 2), batch_size=2, grad_accum_steps=1, mixed_precision="bf16")
    )
    assert plan.sample_exact
    assert "FSDP2 4 -> HSDP 2x2" in plan.warning
    assert "mixed_precision no -> bf16" in plan.warning


def test_peft_mismatch_is_refused():
    shape = RunShape(Topology(1, 4), batch_size=2, grad_accum_steps=1, mixed_precision="no", peft=True)
    with pytest.raises(ResumeRefusedError, match=r"--policy\.path"):
        plan_resume(SAVED, shape)


def test_context_parallel_is_reserved():
    shape = RunShape(Topology(1, 4, cp_size=2), batch_size=2, grad_accum_steps=1, mixed_precision="no")
    with pytest.raises(ResumeRefusedError, match="cp_size"):
        plan_resume(SAVED, shape)


def test_a_step_inside_an_accumulation_window_is_warned_as_lost_gradients():
    """Only an older release could save step 30 of windows of 4; this one refuses such a --save_freq."""
    saved = dataclasses.replace(SAVED, grad_accum_steps=4)
    same = RunShape(Topology(1, 4), batch_size=2, grad_accum_steps=4, mixed_precision="no")
    assert "step 30 is inside an accumulation window of 4 steps" in plan_resume(saved, same).warning
    at_window_end = dataclasses.replace(saved, step=32)
    assert plan_resume(at_window_end, same).warning is None
