"""LeRobot's multi-GPU command variants under one torchrun launch of 4 gloo ranks
(scripts/lerobot_variants.py): FSDP2 with gradient accumulation, HSDP 2x2 and LoRA on FSDP2 each train
and save the step the command asks for, sharded as asked (HSDP with checkpointed units)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import ckpt_tools
from helpers.launch import run_torchrun
from helpers.lerobot_data import write_dataset
from helpers.train_flags import TINY_LEROBOT_ACT

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]

SCRIPT = Path(__file__).parent / "scripts" / "lerobot_variants.py"


def test_lerobot_fsdp_hsdp_lora_and_accumulation_commands_run(tmp_path) -> None:
    write_dataset(tmp_path / "ds", [20] * 4, rows_per_file=30)
    log = run_torchrun(SCRIPT, 4, str(tmp_path), str(tmp_path / "ds"), *TINY_LEROBOT_ACT, timeout=400).stdout
    expected = {
        "fsdp": ((1, 4), 2, "effective batch size 16 = batch_size 2 x dp_world_size 4 x grad_accum 2"),
        "hsdp": ((2, 2), 1, "effective batch size 8 = batch_size 2 x dp_world_size 4 x grad_accum 1"),
        "lora": ((1, 4), 1, "effective batch size 8 = batch_size 2 x dp_world_size 4 x grad_accum 1"),
    }
    # the unit count is the policy's own (ACT's layers), whatever its sizes
    assert re.search(r"activation checkpointing: [1-9]\d* units \(by class: ", log)
    for run, (degrees, accum, banner) in expected.items():
        assert f"job act_{run}: act policy" in log and banner in log
        step = ckpt_tools.read_training_step(str(tmp_path / run / "checkpoints" / "000002"))
        assert (step.topology.dp_replicate, step.topology.dp_shard) == degrees
        assert (step.step, step.grad_accum_steps, step.peft) == (2, accum, run == "lora")
