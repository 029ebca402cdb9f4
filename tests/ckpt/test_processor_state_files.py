"""Processor state files named by the config (LeRobot 0.6.1's pipeline schema): written under the
`state_file` names, only for the steps naming one, read back as one tensor dict per step; a processor
whose tensors do not fit its steps is refused before its first byte."""

from __future__ import annotations

import pytest
import torch

from ckpt_tools import layout
from ckpt_tools.errors import UsageError
from ckpt_tools.state.processor_state import ProcessorState, load_processors, write_processors

STATE_FILE = layout.lerobot_state_file_name(layout.PREPROCESSOR, 1, "normalizer_processor")
CONFIG = {
    "name": layout.PREPROCESSOR,
    "steps": [{"registry_name": "to_batch_processor", "config": {}},
              {"registry_name": "normalizer_processor", "config": {}, "state_file": STATE_FILE}],
}  # fmt: skip


def test_named_state_files_are_written_and_read_back(tmp_path) -> None:
    (tmp_path / layout.PRETRAINED_MODEL_DIR).mkdir()
    model = str(tmp_path / layout.PRETRAINED_MODEL_DIR)
    write_processors(model, {layout.PREPROCESSOR: ProcessorState(CONFIG, [{}, {"a.mean": torch.ones(2)}])})
    assert STATE_FILE == "policy_preprocessor_step_1_normalizer_processor.safetensors"
    assert sorted(p.name for p in (tmp_path / layout.PRETRAINED_MODEL_DIR).iterdir()) == [
        "policy_preprocessor.json",
        STATE_FILE,
    ]
    loaded = load_processors(model)[layout.PREPROCESSOR]
    assert loaded.config == CONFIG and loaded.step_tensors[0] == {}
    assert torch.equal(loaded.step_tensors[1]["a.mean"], torch.ones(2))


@pytest.mark.parametrize("tensors", [[{"x": torch.ones(1)}, {}], [{}]])
def test_tensors_that_do_not_fit_the_named_steps_are_refused_before_writing(tmp_path, tensors) -> None:
    with pytest.raises(UsageError, match="names state files for 2 steps"):
        write_processors(str(tmp_path), {layout.PREPROCESSOR: ProcessorState(CONFIG, tensors)})
    assert list(tmp_path.iterdir()) == []
