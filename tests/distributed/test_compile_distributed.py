"""Activation checkpointing and compile under FSDP2 and DDP (2 gloo ranks, one launch:
scripts/compile_runs.py): the update is the plain run's bit for bit, the DCP and safetensors keys are
the plain policy's, and a plain checkpoint resumes into a checkpointed, compiled run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ckpt_tools.tensors.tensor_io import read_dcp_full, read_safetensors
from helpers.launch import run_torchrun

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]

SCRIPT = Path(__file__).parent / "scripts" / "compile_runs.py"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("compile_runs")
    log = run_torchrun(SCRIPT, 2, str(out), timeout=280).stdout
    return out, log


def step(out: Path, run: str) -> Path:
    return out / run / "checkpoints" / "000004"


def test_fsdp_and_ddp_transforms_keep_the_plain_update_and_keys(runs) -> None:
    out, log = runs
    assert "activation checkpointing: 2 units (by class: MLPBlock)" in log
    assert "torch.compile: 2 units, backend aot_eager, mode default" in log
    # mixed: a plain step-2 checkpoint resumed with the transforms on
    for reference, run in (("plain", "fast"), ("plain", "mixed"), ("ddp_plain", "ddp_fast")):
        plain = read_safetensors(str(step(out, reference) / "pretrained_model" / "model.safetensors"))[0]
        got = read_safetensors(str(step(out, run) / "pretrained_model" / "model.safetensors"))[0]
        assert got.keys() == plain.keys()
        assert all(torch.equal(got[k], plain[k]) for k in plain), run
    plain_dcp = read_dcp_full(str(step(out, "plain") / "pretrained_model" / "pytorch_model_fsdp_0"))
    fast_dcp = read_dcp_full(str(step(out, "fast") / "pretrained_model" / "pytorch_model_fsdp_0"))
    assert fast_dcp.keys() == plain_dcp.keys()
    assert not any("_orig_mod" in k or "checkpoint_wrapped" in k for k in fast_dcp)
    assert all(torch.equal(fast_dcp[k], plain_dcp[k]) for k in plain_dcp)
