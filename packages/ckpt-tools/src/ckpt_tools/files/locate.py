"""From what a user passes (a step directory, `checkpoints/last`, a run's output_dir, its
`checkpoints/` directory or a `pretrained_model/`) to the step and model directories it means."""

from __future__ import annotations

import os

from ckpt_tools.errors import CheckpointNotFoundError, CorruptCheckpointError, NotACheckpointError
from ckpt_tools.files.commit import follow_pointers
from ckpt_tools.files.storage import absolute, check_links, exists, is_dir, read_bytes
from ckpt_tools.format import layout
from ckpt_tools.format.meta import TrainingStep
from ckpt_tools.format.untrusted import MAX_CONFIG_BYTES


def resolve_model_dir(path: str | os.PathLike[str]) -> tuple[str | None, str]:
    """Accept a step directory, `checkpoints/last` or `checkpoints/best`, a run's output_dir, its
    `checkpoints/` directory or a `pretrained_model/`.

    Returns `(step_dir, pretrained_model_dir)`; `step_dir` is None for a bare model directory
    (a converted or downloaded one). Raises `CheckpointNotFoundError` for a missing path and
    `CorruptCheckpointError` for a pointer that `read_pointer` refuses, or a directory holding a link that
    leads outside it (`storage.check_links`).
    """
    text = follow_pointers(path)
    if not exists(text):
        raise CheckpointNotFoundError(f"{text}: no such file or directory")
    base = text if layout.is_url(text) else absolute(text)
    if layout.name(base) == layout.PRETRAINED_MODEL_DIR:
        step_dir, model_dir = layout.parent(base), base
    elif is_dir(layout.join(base, layout.PRETRAINED_MODEL_DIR)):
        step_dir, model_dir = base, layout.join(base, layout.PRETRAINED_MODEL_DIR)
    else:
        step_dir, model_dir = None, base
    check_links(step_dir or model_dir)  # every reader comes through here
    return step_dir, model_dir


def read_training_step(path: str | os.PathLike[str]) -> TrainingStep:
    """Read `training_state/training_step.json` of a step directory, `last`, an output_dir or a
    `pretrained_model/` inside a step directory."""
    step_dir, _ = resolve_model_dir(path)
    if step_dir is None:
        raise NotACheckpointError(
            f"{os.fspath(path)} is a model directory without training_state/; pass a step directory "
            "(checkpoints/005000) or checkpoints/last"
        )
    source = layout.join(step_dir, layout.TRAINING_STATE_DIR, layout.TRAINING_STEP)
    saved = TrainingStep.from_json(read_bytes(source, MAX_CONFIG_BYTES), source=source)
    name = layout.name(step_dir)
    if layout.is_step_dir_name(name) and int(name) != saved.step:
        raise CorruptCheckpointError(
            f"{source} records step {saved.step} inside the step directory {name}: one of them was edited "
            "or copied over; resume from, or verify, a step whose name and record agree"
        )
    return saved
