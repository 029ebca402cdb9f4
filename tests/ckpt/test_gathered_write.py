"""A gathered safetensors file written tensor by tensor (state/gathered_write.py) has the bytes the
safetensors library writes for the same tensors, and the manifest's digest of those bytes."""

from __future__ import annotations

import hashlib

import pytest
import torch
from safetensors.torch import save

from ckpt_tools.errors import SaveFailedError
from ckpt_tools.files.digest import Recorder
from ckpt_tools.state.collective import Group
from ckpt_tools.state.gathered_write import write_gathered_safetensors
from ckpt_tools.tensors.tensor_io import stream_safetensors


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    wide = torch.randn(6, 5, generator=g)
    return {
        "b.weight": torch.randn(4, 3, generator=g).to(torch.bfloat16),
        "a.weight": wide,
        "a.transposed": wide.t(),  # not contiguous, and sharing the storage of another tensor
        "steps": torch.tensor(7, dtype=torch.int64),
        "empty": torch.zeros(0, 3),
        "mask": torch.tensor([True, False, True]),
        "half": torch.randn(5, generator=g).half(),
    }


def test_bytes_and_digest_equal_the_librarys_save(tmp_path) -> None:
    path = str(tmp_path / "model.safetensors")
    recorder = Recorder()
    write_gathered_safetensors(path, _state(), Group(None), recorder)
    written = (tmp_path / "model.safetensors").read_bytes()
    state = {k: v.contiguous() for k, v in _state().items()}
    state["a.transposed"] = state["a.transposed"].clone()
    assert written == save(state, metadata={"format": "pt"})
    assert recorder.entries() == {path: (len(written), hashlib.sha256(written).hexdigest())}
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]  # the temporary file renamed


def test_a_failed_write_leaves_no_file_and_is_kept_for_agree(tmp_path, monkeypatch) -> None:
    from ckpt_tools.files import safetensors_writer

    def full_disk(self, data) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors_writer.SafetensorsStreamWriter, "write", full_disk)
    group = Group(None)
    write_gathered_safetensors(str(tmp_path / "model.safetensors"), _state(), group, None)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(SaveFailedError, match="No space left on device"):
        group.agree("saving step 1")


def test_a_streamed_file_with_metadata_has_the_librarys_bytes(tmp_path) -> None:
    """`stream_safetensors` (the optimizer state's writer) with header metadata, and without."""
    state = {k: v.contiguous().clone() for k, v in _state().items()}
    for metadata in ({"state_extras": '{"a": 1}'}, None):
        path = tmp_path / "optimizer_state.safetensors"
        stream_safetensors(str(path), state, metadata, None)
        assert path.read_bytes() == save(state, metadata=metadata)
