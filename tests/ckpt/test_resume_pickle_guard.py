"""`load_training_state` reads every DCP `.metadata` with the restricted unpickler before torch does.

torch's DCP reader unpickles `.metadata` with the standard unpickler, so a crafted checkpoint would run
code on every rank of a resume. Each case plants a payload whose effect is a file on disk: the load
must refuse it, and the file must not exist afterwards.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ckpt_tools import layout
from ckpt_tools.errors import UnsafePickleError
from ckpt_tools.training import load_training_state
from helpers.pickle_payload import malicious_dcp_metadata
from helpers.tiny_run import make_run, save, train


def _plant(dcp_dir: Path, target: Path) -> None:
    dcp_dir.mkdir(parents=True, exist_ok=True)
    (dcp_dir / layout.DCP_METADATA).write_bytes(malicious_dcp_metadata(target))


def _optimizer(step: Path, target: Path) -> None:
    _plant(step / layout.TRAINING_STATE_DIR / layout.OPTIMIZER_DCP_DIR, target)


def _model(step: Path, target: Path) -> None:
    model_dir = step / layout.PRETRAINED_MODEL_DIR
    (model_dir / layout.MODEL_SAFETENSORS).unlink()  # the DCP shards are then the weights to load
    _plant(model_dir / layout.MODEL_DCP_DIR, target)


def _adapter(step: Path, target: Path) -> None:
    model_dir = step / layout.PRETRAINED_MODEL_DIR
    (model_dir / layout.ADAPTER_CONFIG).write_text(json.dumps({"peft_type": "LORA", "r": 2}))
    _plant(model_dir / layout.ADAPTER_DCP_DIR, target)


@pytest.fixture(scope="module")
def saved_step(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model, optimizer, scheduler = make_run()
    train(model, optimizer, scheduler, 2)
    return Path(save(tmp_path_factory.mktemp("ckpt"), 2, model, optimizer, scheduler))


@pytest.mark.parametrize("plant", [_optimizer, _model, _adapter], ids=["optimizer_0", "model", "adapter"])
def test_crafted_metadata_is_refused_and_never_run(saved_step: Path, tmp_path: Path, plant) -> None:  # type: ignore[no-untyped-def]
    step = tmp_path / saved_step.name
    shutil.copytree(saved_step, step)
    target = tmp_path / "payload_ran"
    plant(step, target)
    model, optimizer, scheduler = make_run(seed=1)

    with pytest.raises(UnsafePickleError, match=r"\.metadata.*posix\.system"):
        load_training_state(step, model=model, optimizer=optimizer, scheduler=scheduler)

    assert not target.exists()
