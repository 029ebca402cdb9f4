"""What a trainer checkpoint stores of a run's tensors, read back whole, for bit-for-bit comparisons."""

from __future__ import annotations

from pathlib import Path

import torch

import ckpt_tools
from ckpt_tools import layout
from ckpt_tools.tensors.tensor_io import read_dcp_full, read_safetensors


def optimizer_state(step: Path) -> dict[str, torch.Tensor]:
    """The optimizer state of a step directory, whatever format it was saved in (DCP or safetensors)."""
    state_dir = step / layout.TRAINING_STATE_DIR
    if (state_dir / "optimizer_0").is_dir():
        return read_dcp_full(str(state_dir / "optimizer_0"))
    return read_safetensors(str(state_dir / layout.OPTIMIZER_SAFETENSORS))[0]


def assert_bit_identical(a: Path, b: Path) -> None:
    """Model weights and optimizer state of two step directories, bit for bit."""
    for load in (ckpt_tools.load_model_state_dict, optimizer_state):
        got, want = load(a), load(b)
        assert got.keys() == want.keys()
        for key, tensor in want.items():
            assert got[key].dtype == tensor.dtype and torch.equal(got[key], tensor), key
