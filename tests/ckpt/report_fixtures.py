"""Hand-built checkpoints for the read-only report tests (inspect, verify, diff, the bad-input battery).

They follow layout.py's names and write each file with the library the format names (safetensors'
`save_file`, torch's DCP `save`), so the readers under test meet files they did not write themselves.
"""

from __future__ import annotations

import json
import pickle
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file

from ckpt_tools import layout
from ckpt_tools.format.meta import SamplerPosition, Topology, TrainingStep

_HERE = Path(__file__).parent
_FSDP_RUNS: dict[str, Path] = {}


def tiny_model_state(seed: int = 0) -> dict[str, torch.Tensor]:
    """An odd-sized little model, plus a bf16 and an integer tensor so dtypes vary."""
    gen = torch.Generator().manual_seed(seed)
    return {
        "encoder.weight": torch.randn(7, 5, generator=gen),
        "encoder.bias": torch.randn(7, generator=gen),
        "head.weight": torch.randn(3, 7, generator=gen).to(torch.bfloat16),
        "head.count": torch.arange(4, dtype=torch.int64),
    }


def training_step(fmt: str = "safetensors", dp_shard: int = 1, step: int = 5) -> TrainingStep:
    return TrainingStep(
        step=step,
        dp_world_size=dp_shard,
        batch_size=8,
        grad_accum_steps=2,
        mixed_precision="bf16",
        topology=Topology(dp_replicate=1, dp_shard=dp_shard),
        checkpoint_format=fmt,
        sampler=SamplerPosition(epoch=0, offset=80),
    )


def dcp_save(state: dict[str, object], directory: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save(state, checkpoint_id=str(directory), no_dist=True)


def write_step_dir(
    root: Path,
    fmt: str = "safetensors",
    dp_shard: int = 1,
    step: int = 5,
    state: dict[str, torch.Tensor] | None = None,
) -> Path:
    """A complete step directory of the given checkpoint format; returns its path."""
    state = tiny_model_state() if state is None else state
    step_dir = root / layout.step_dir_name(step)
    model_dir = step_dir / layout.PRETRAINED_MODEL_DIR
    state_dir = step_dir / layout.TRAINING_STATE_DIR
    model_dir.mkdir(parents=True)
    state_dir.mkdir()
    (model_dir / layout.POLICY_CONFIG).write_text(json.dumps({"type": "mlp"}))
    if fmt in ("safetensors", "safetensors_dcp"):
        save_file(state, str(model_dir / layout.MODEL_SAFETENSORS), metadata={"format": "pt"})
    if fmt in ("dcp", "safetensors_dcp"):
        dcp_save(dict(state), model_dir / layout.MODEL_DCP_DIR)
    (state_dir / layout.TRAINING_STEP).write_text(training_step(fmt, dp_shard, step).to_json())
    save_file({"torch_cpu": torch.get_rng_state()}, str(state_dir / layout.RNG_STATE))
    exp_avg = {f"state.{name}.exp_avg": torch.zeros(t.shape) for name, t in state.items()}
    if dp_shard > 1:
        dcp_save({**exp_avg, "param_groups.lr": 0.001}, state_dir / layout.OPTIMIZER_DCP_DIR)
    else:
        save_file(exp_avg, str(state_dir / layout.OPTIMIZER_SAFETENSORS))
        (state_dir / layout.OPTIMIZER_PARAM_GROUPS).write_text(json.dumps([{"lr": 0.001}]))
    return step_dir


def rewrite_dcp_metadata(dcp_dir: Path, edit) -> None:  # type: ignore[no-untyped-def]
    """Load `.metadata` with torch, let `edit(metadata)` change it, and pickle it back."""
    path = dcp_dir / layout.DCP_METADATA
    metadata = dcp.FileSystemReader(str(dcp_dir)).read_metadata()
    edit(metadata)
    path.write_bytes(pickle.dumps(metadata))


def fsdp_checkpoint(tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    """The step directory a 2-rank FSDP2 run saved (safetensors_dcp), made once per test session.

    Cached here rather than in a conftest so every report test module shares the one torchrun launch.
    Tests that damage it must work on a copy (`copy_checkpoint`).
    """
    key = str(tmp_path_factory.getbasetemp())
    if key not in _FSDP_RUNS:
        from helpers.launch import run_torchrun  # tests/ is on sys.path (tests/conftest.py)

        out = tmp_path_factory.mktemp("fsdp-run")
        run_torchrun(_HERE.parent / "distributed" / "scripts" / "report_fsdp_save.py", 2, str(out))
        _FSDP_RUNS[key] = out / layout.step_dir_name(1)
    return _FSDP_RUNS[key]


def copy_checkpoint(step_dir: Path, dest: Path, *, manifest: bool = False) -> Path:
    """A copy to damage. Without `manifest`, its `manifest.json` is left out, so a test of another
    check sees only that check's problem (the manifest's own checks have their tests)."""
    target = dest / step_dir.name
    shutil.copytree(step_dir, target, symlinks=True)
    if not manifest:
        (target / layout.MANIFEST).unlink(missing_ok=True)
    return target


def run_ckpt(*args: str):  # type: ignore[no-untyped-def]
    """Invoke the real `ckpt` app in-process; the result has separate `.stdout` and `.stderr`."""
    from typer.testing import CliRunner

    from ckpt_tools.cli import app as app_module

    if not app_module.app.registered_commands:
        app_module._register()
    return CliRunner().invoke(app_module.app, [str(a) for a in args])
