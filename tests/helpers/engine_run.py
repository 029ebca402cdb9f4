"""A whole `trainer train` run inside a test: from a working directory (where relative dataset roots and
a VLA's backbone name resolve, as in a user's run), with accelerate's process state reset around it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from trainer.cli.parse import parse_config
from trainer.engine.plan import train

# A SmolVLA on the tiny backbone of tests/fixtures/lerobot_smolvla_tiny (copied as `tiny_smolvlm`).
TINY_SMOLVLA = [
    "--policy.type=smolvla",
    "--policy.vlm_model_name=tiny_smolvlm",
    "--policy.load_vlm_weights=false",
    "--policy.chunk_size=5",
    "--policy.n_action_steps=5",
    "--policy.num_vlm_layers=4",
    "--policy.num_steps=3",
    "--policy.resize_imgs_with_padding=[32,32]",
    "--batch_size=2",
    "--num_workers=0",
    "--log_freq=1",
]


def train_in(workdir: Path, flags: list[str]) -> None:
    """Parse `flags` and train, from `workdir`."""
    from accelerate.state import AcceleratorState

    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(workdir)
        AcceleratorState._reset_state(reset_partial_state=True)
        try:
            train(parse_config(flags))
        finally:
            AcceleratorState._reset_state(reset_partial_state=True)


def rewound_copy(run: Path, copy: Path, step: int) -> Path:
    """A copy of the run directory `run` at `copy` as if it had stopped after saving `step`: the later
    checkpoints removed, `last` naming that step (a resume from there retrains the steps after it)."""
    shutil.copytree(run, copy, symlinks=True)
    checkpoints = copy / "checkpoints"
    for later in [c for c in checkpoints.iterdir() if c.name.isdigit() and int(c.name) > step]:
        shutil.rmtree(later)
    (checkpoints / "last").unlink()
    (checkpoints / "last").symlink_to(f"{step:06d}")
    return copy
