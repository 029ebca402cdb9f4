"""A sharded safetensors set (huggingface_hub's layout) loads into a meta-built FSDP2 model on 2 gloo
ranks in bounded memory: each rank reads only its rows of each tensor from the shard file holding it,
so its peak grows by less than the largest tensor plus 8 MiB, whatever the set's total (96 MiB here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from huggingface_hub import save_torch_state_dict

from helpers.launch import run_torchrun

pytestmark = pytest.mark.distributed

SCRIPT = Path(__file__).parent / "scripts" / "sharded_load_memory.py"
LAYERS, WIDTH = 6, 2048
LARGEST_KIB = WIDTH * WIDTH * 4 // 1024


def test_a_sharded_set_loads_into_fsdp2_shards_in_bounded_memory(tmp_path: Path) -> None:
    source = tmp_path / "set"
    source.mkdir()
    generator = torch.Generator().manual_seed(0)
    state = {f"{i}.weight": torch.randn(WIDTH, WIDTH, generator=generator) for i in range(LAYERS)}
    save_torch_state_dict(state, source, max_shard_size="40MB")  # three shards of two tensors
    del state
    run_torchrun(SCRIPT, 2, str(source), str(tmp_path / "rank"), timeout=240)
    for rank in range(2):
        result = json.loads((tmp_path / f"rank.{rank}.json").read_text())
        assert result["same"] and result["shards"] == 3, result
        assert result["grew_kib"] < LARGEST_KIB + 8 * 1024, result
