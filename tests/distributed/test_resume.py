"""Two-phase resume on real gloo process groups: bit-exact on the same topology, within fp32 rounding
across topologies, after crashes, in every checkpoint format.

One uninterrupted reference run R (FSDP2 on 4 ranks, DCP, 6 steps, saves at 3 and 6, rank 0 slowed
down inside every save) is launched once per session; every other run resumes from one of its
checkpoints or from a checkpoint of a run that did. Runs are launched lazily and cached, so a test
only pays for the launches it needs.

The tiny policy has no dropout, and the dataset (one 200-sample episode) is shorter than the 6 x 64
samples consumed, so step 4 starts the sampler's second epoch right after the step-3 checkpoint.

Tolerance across topologies (RTOL): the global batch is unchanged, so every run sees the same samples
and the same learning rate; only the order of fp32 additions differs (per-rank means then a mean
across ranks, reduce-scatter vs all-reduce of gradients, a 2-D mesh's two-stage reduction). Each sum
carries relative rounding of order n * 2**-24 (~6e-8 per add); after three AdamW updates the measured
loss differences are ~1e-7 relative, so 1e-5 leaves two orders of margin and still catches a wrong
sample, step or learning rate (which move the loss by > 1e-3).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

import ckpt_tools
from ckpt_tools import layout
from helpers.launch import CKPT_CLI, run_torchrun
from helpers.run_outputs import metrics, model_file, saved_step
from helpers.stored_state import assert_bit_identical

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]

SCRIPT = Path(__file__).parent / "scripts" / "resume_train.py"
RTOL = 1e-5

COMMON = [
    "--policy.type=mlp",
    "--policy.hidden_dim=16",
    "--policy.dropout=0",
    "--dataset.episodes=1",
    "--dataset.eval_episodes=0",
    "--steps=6",
    "--save_freq=3",
    "--log_freq=1",
    "--use_policy_training_preset=false",
    "--scheduler.warmup_steps=2",
    "--seed=7",
]
FSDP4 = ["--parallelism.dp_shard=4", "--batch_size=16", "--checkpoint_format=dcp"]
# Topologies resumed from R's step 3, each with the same global batch of 64 samples.
TOPOLOGIES = {
    # No layout flag: R's dp_shard=4 does not fit 2 ranks, so the run plan keeps it sharded over both.
    "fsdp2x2ranks": (2, ["--batch_size=32", "--checkpoint_format=safetensors_dcp"]),
    "hsdp2x2": (
        4,
        ["--parallelism.dp_replicate=2", "--parallelism.dp_shard=2", "--checkpoint_format=safetensors"],
    ),
    # Non-sharded: R's saved --checkpoint_format=dcp turns into safetensors by itself (one log line).
    "ddp2": (2, ["--parallelism.dp_replicate=2", "--parallelism.dp_shard=1", "--batch_size=32"]),
    "single": (1, ["--parallelism.dp_shard=1", "--batch_size=64"]),
}


# What each of them saves.
TOPOLOGY_FORMATS = {
    "fsdp2x2ranks": "safetensors_dcp",
    "hsdp2x2": "safetensors",
    "ddp2": "safetensors",
    "single": "safetensors",
}


class Runs:
    """Launch each named run at most once per session and keep its output."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.logs: dict[str, str] = {}
        self.common = [*COMMON, f"--dataset.cache_dir={root / 'dataset-cache'}"]

    def launch(
        self, name: str, nproc: int, *args: str, out: Path | None = None, check: bool = True, **launcher
    ) -> Path:
        """Run `name` (output in `out`, default root/name) unless it already ran; return `out`."""
        out = out or self.root / name
        if name not in self.logs:
            result = run_torchrun(
                SCRIPT, nproc, *args, f"--output_dir={out}", timeout=120, check=check, **launcher
            )
            self.logs[name] = result.stdout
            (self.root / f"{name}.log").write_text(result.stdout)
            if not check:
                assert result.returncode != 0, f"{name} was expected to fail:\n{result.stdout}"
        return out

    def reference(self) -> Path:
        """R: FSDP2 x4, uninterrupted; rank 0 writes the side files 1 s late in every save."""
        return self.launch("R", 4, "--hook-slow-save=1.0", *self.common, *FSDP4)

    def from_reference(self, name: str) -> Path:
        """Resume R's step 3 on another topology, saving at steps 4 and 6."""
        nproc, flags = TOPOLOGIES[name]
        return self.launch(name, nproc, *resume_from(self.reference(), 3), "--save_freq=2", *flags)


@pytest.fixture(scope="session")
def runs(tmp_path_factory) -> Runs:
    return Runs(tmp_path_factory.mktemp("resume"))


def resume_from(out: Path, step: int) -> list[str]:
    config = model_file(out, step, "train_config.json")
    return ["--resume=true", f"--config_path={config}"]


def train_records(out: Path) -> dict[int, dict]:
    """Each step's training record; a step logged again after a resume keeps the later record."""
    return {r["step"]: r for r in metrics(out, "train")}


def resume_notes(out: Path) -> list[dict]:
    return metrics(out, "resume")


def ckpt_verify(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CKPT_CLI), "verify", str(path)], capture_output=True, text=True, timeout=60)


def assert_same_losses(got: Path, want: Path, steps: range, rtol: float = 0.0) -> None:
    """Per-step losses (exactly, or within rtol) and learning rates (exactly: the scheduler resumed)."""
    a, b = train_records(got), train_records(want)
    for step in steps:
        assert a[step]["lr"] == b[step]["lr"], step
        if rtol == 0.0:
            assert a[step]["loss"] == b[step]["loss"], step
        else:
            assert a[step]["loss"] == pytest.approx(b[step]["loss"], rel=rtol, abs=0), step


# ------------------------------------------------------------------------------- same topology


def test_slow_rank0_save_completes_and_verifies(runs):
    out = runs.reference()
    assert runs.logs["R"].count("hook: rank 0 writes the side files") == 2
    for step in (3, 6):
        assert ckpt_verify(saved_step(out, step)).returncode == 0
    assert os.readlink(out / "checkpoints" / "last") == "000006"


def test_crash_in_training_then_auto_resume_is_bit_exact(runs):
    reference = runs.reference()
    crashed = runs.launch("X1", 4, "--hook-kill-train=3:5", *runs.common, *FSDP4, check=False)
    assert "hook: rank 3 killed at its training step call 5" in runs.logs["X1"]
    verified = ckpt_verify(crashed / "checkpoints" / "last")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert os.readlink(crashed / "checkpoints" / "last") == "000003"

    runs.launch("A1", 4, "--resume=true", out=crashed)  # and --output_dir: the saved config is found
    assert f"resuming from {saved_step(crashed, 3)} at step 3" in runs.logs["A1"]
    assert "warning:" not in runs.logs["A1"]  # same topology and batch: nothing to warn about
    assert_bit_identical(saved_step(crashed, 6), saved_step(reference, 6))
    assert_same_losses(crashed, reference, range(1, 7))


def test_crash_inside_save_keeps_last_and_resumes_bit_exact(runs):
    reference = runs.reference()
    args = ["--resume=true", *runs.common, *FSDP4]  # what a torchrun --max-restarts relaunch repeats
    crashed = runs.launch("X2", 4, "--hook-kill-save=1:6", *args, check=False)
    log = runs.logs["X2"]
    assert "no checkpoint under" in log and "starting a fresh run" in log
    assert "hook: rank 1 killed inside the save of step 6" in log
    assert (crashed / "checkpoints" / ".tmp-000006").is_dir()  # the interrupted save, never committed
    assert not saved_step(crashed, 6).exists()
    assert os.readlink(crashed / "checkpoints" / "last") == "000003"
    assert ckpt_verify(crashed / "checkpoints" / "last").returncode == 0

    runs.launch("A2", 4, *args, out=crashed)
    assert_bit_identical(saved_step(crashed, 6), saved_step(reference, 6))
    assert_same_losses(crashed, reference, range(1, 7))
    assert not (crashed / "checkpoints" / ".tmp-000006").exists()


def test_torchrun_max_restarts_recovers_without_a_person(runs, monkeypatch):
    """A rank killed inside a save under `torchrun --max-restarts=1`: the relaunch repeats the same
    command, which finds `last` (the step before the interrupted save) and finishes the run."""
    # torchrun shares its rendezvous TCPStore with the workers by default, and a relaunched worker can
    # read the dead attempt's gloo address from it (pytorch/pytorch#135712): docs/resume.md says so.
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    flags = [
        "--resume=true",
        *runs.common,
        "--parallelism.dp_shard=2",
        "--batch_size=32",
        "--checkpoint_format=safetensors",  # gathered weights + DCP optimizer, resumed by the relaunch
    ]
    out = runs.launch("restarts", 2, "--hook-kill-save=1:6", *flags, torchrun_args=["--max-restarts=1"])
    log = runs.logs["restarts"]
    assert "hook: rank 1 killed inside the save of step 6" in log
    assert f"resuming from {saved_step(out, 3)} at step 3" in log
    assert model_file(out, 3).is_file()
    assert (saved_step(out, 3) / "training_state" / "optimizer_0").is_dir()
    assert os.readlink(out / "checkpoints" / "last") == "000006"
    assert ckpt_verify(out / "checkpoints" / "last").returncode == 0
    assert_same_losses(out, runs.reference(), range(1, 7), rtol=RTOL)  # FSDP2 x2 vs the x4 reference


# ---------------------------------------------------------------------------- changed topology


@pytest.mark.numerics
@pytest.mark.parametrize("name", list(TOPOLOGIES))
def test_changed_topology_matches_uninterrupted_run(runs, name):
    out = runs.from_reference(name)
    assert_same_losses(out, runs.reference(), range(4, 7), rtol=RTOL)
    got = ckpt_tools.load_model_state_dict(saved_step(out, 6))
    want = ckpt_tools.load_model_state_dict(saved_step(runs.reference(), 6))
    for key, tensor in want.items():
        torch.testing.assert_close(got[key], tensor, rtol=1e-4, atol=1e-6)
    [note] = resume_notes(out)
    assert note["step"] == 3 and any(change.startswith("topology FSDP2 4 -> ") for change in note["changes"])
    assert "the data order is unchanged" in runs.logs[name]
    assert "global batch changed" not in runs.logs[name]
    switched = "--checkpoint_format=dcp of the saved config needs a sharded run" in runs.logs[name]
    assert switched == (name in ("ddp2", "single"))
    assert ckpt_tools.read_training_step(saved_step(out, 6)).checkpoint_format == TOPOLOGY_FORMATS[name]
    settled = "the saved --parallelism.dp_replicate=1 --parallelism.dp_shard=4 does not fit 2 processes"
    assert (settled in runs.logs[name]) == (name == "fsdp2x2ranks")
    saved = json.loads(model_file(out, 6, "train_config.json").read_text())
    assert saved["checkpoint_format"] == TOPOLOGY_FORMATS[name]  # what the plan settled, not the saved dcp
    assert (saved["resume"], saved["output_dir"]) == (False, str(out))
    if name == "fsdp2x2ranks":
        assert (saved["parallelism"]["dp_replicate"], saved["parallelism"]["dp_shard"]) == (1, -1)


@pytest.mark.numerics
def test_hsdp_ddp_fsdp2_loss_parity(runs):
    """Same global batch, same samples: the three data-parallel engines agree step by step."""
    fsdp2, hsdp, ddp = (train_records(runs.from_reference(n)) for n in ("fsdp2x2ranks", "hsdp2x2", "ddp2"))
    for step in range(4, 7):
        losses = [fsdp2[step]["loss"], hsdp[step]["loss"], ddp[step]["loss"]]
        assert max(losses) - min(losses) <= RTOL * abs(losses[0]), (step, losses)


# ----------------------------------------------------------------------------- formats, precision


def test_safetensors_dcp_resumes_bit_exact(runs):
    """Every format resumes: dcp in the crash tests, safetensors from a sharded run (full weights +
    DCP optimizer) in the max-restarts test, non-sharded safetensors in the DDP -> FSDP2 test, and
    safetensors_dcp (weights read from its DCP shards) here, from the FSDP2 x2 run's step 4."""
    origin = runs.from_reference("fsdp2x2ranks")
    assert model_file(origin, 4).is_file()
    out = runs.launch("fsdp2x2ranks-again", 2, *resume_from(origin, 4))
    assert_bit_identical(saved_step(out, 6), saved_step(origin, 6))
    assert_same_losses(out, origin, range(5, 7))


def test_ddp_checkpoint_resumes_into_fsdp2(runs):
    """A non-sharded checkpoint (model.safetensors + optimizer_state.safetensors) into FSDP2."""
    origin = runs.from_reference("ddp2")
    assert (saved_step(origin, 4) / "training_state" / "optimizer_state.safetensors").is_file()
    flags = ["--parallelism.dp_replicate=1", "--parallelism.dp_shard=2"]
    out = runs.launch("ddp2-to-fsdp2", 2, *resume_from(origin, 4), *flags)
    assert "topology DDP 2 -> FSDP2 2" in runs.logs["ddp2-to-fsdp2"]
    assert_same_losses(out, origin, range(5, 7), rtol=RTOL)


def test_bf16_with_dropout_resumes_bit_exact(runs):
    """bf16 autocast under FSDP2, with dropout on: exact only if every rank's RNG stream is restored."""
    flags = [
        *runs.common,
        "--policy.dropout=0.1",
        "--accelerator.mixed_precision=bf16",
        "--parallelism.dp_shard=2",
        "--batch_size=8",
        "--checkpoint_format=dcp",
    ]
    straight = runs.launch("bf16", 2, *flags)
    out = runs.launch("bf16-resumed", 2, *resume_from(straight, 3))
    assert_bit_identical(saved_step(out, 6), saved_step(straight, 6))
    assert_same_losses(out, straight, range(4, 7))


def test_fp16_loss_scaler_state_resumes_bit_exact(runs):
    """fp16 autocast with a loss scaler on CPU (the factory's CPU fp16 adapter), DDP 2: the scaler's
    scale and growth tracker are saved with every checkpoint and restored on resume."""
    flags = [*runs.common, "--accelerator.mixed_precision=fp16", "--parallelism.dp_replicate=2"]
    straight = runs.launch("fp16", 2, *flags, "--batch_size=8")
    out = runs.launch("fp16-resumed", 2, *resume_from(straight, 3))

    def scaler(run: Path, step: int) -> dict:
        return json.loads((saved_step(run, step) / "training_state" / layout.SCALER_STATE).read_text())

    # one update per step: an overflow (fp16's first steps may have one) halves the scale from 2**16
    # and restarts the count of good updates; none after step 3
    skipped = 3 - scaler(straight, 3)["_growth_tracker"]
    assert skipped <= 1 and scaler(straight, 3)["scale"] == 2.0 ** (16 - skipped)
    assert scaler(out, 6) == scaler(straight, 6) and scaler(out, 6)["_growth_tracker"] == 6 - skipped
    assert "mixed precision fp16" in runs.logs["fp16-resumed"]
    assert_bit_identical(saved_step(out, 6), saved_step(straight, 6))
    assert_same_losses(out, straight, range(4, 7))
