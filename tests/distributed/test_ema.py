"""`--ema.*` on real gloo process groups: the shadow kept on every rank in the parameters' own sharding.

One torchrun launch on 2 ranks (scripts/ema_run.py says what it runs) serves every test here but the
HSDP one (a second launch, on 4 ranks): the
saved shadow equals a reference EMA computed in one process on full tensors from the same weight
trajectory (bit for bit: the update is elementwise, so a shard's result is the full tensor's slice),
a same-topology resume continues it bit for bit, and one process resumes the FSDP2 step (DCP shards
resharded into plain tensors).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import ckpt_tools
from ckpt_tools import layout
from helpers.launch import CKPT_CLI, launch_env, run_torchrun
from helpers.run_outputs import model_file

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]

SCRIPTS = Path(__file__).parent / "scripts"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ema_runs")
    launch = run_torchrun(SCRIPTS / "ema_run.py", 2, str(out), "two", timeout=240)
    (out / "launch.log").write_text(launch.stdout)
    return out


@pytest.fixture(scope="module")
def hsdp_runs(runs: Path) -> Path:
    """The 4-rank launch, after the 2-rank one whose FSDP2 step it resumes."""
    launch = run_torchrun(SCRIPTS / "ema_run.py", 4, str(runs), "hsdp", timeout=240)
    (runs / "hsdp_launch.log").write_text(launch.stdout)
    return runs


def final_ema(runs: Path, run: str) -> dict[str, torch.Tensor]:
    return ckpt_tools.load_model_state_dict(runs / run / "checkpoints" / "000004", weights="ema")


def assert_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name


@pytest.mark.parametrize("run", ["ddp", "fsdp2"])
def test_shadow_is_the_reference_ema_of_the_weight_trajectory(runs: Path, run: str) -> None:
    reference = load_file(runs / run / "reference_ema.safetensors")
    step = runs / run / "checkpoints" / "000004"
    saved = ckpt_tools.load_model_state_dict(step, weights="ema")
    model = ckpt_tools.load_model_state_dict(step)
    assert saved.keys() == model.keys()  # parameters from the EMA, buffers (none here) from the model
    assert_equal(saved, reference)
    assert any(not torch.equal(model[name], reference[name]) for name in reference)  # not a copy
    name = layout.EMA_SAFETENSORS if run == "ddp" else layout.EMA_DCP_DIR
    assert (step / "pretrained_model" / name).exists()
    manifest = (step / layout.MANIFEST).read_text()
    assert f"pretrained_model/{name}" in manifest
    assert ckpt_tools.verify_checkpoint(step, deep=True).ok
    assert ckpt_tools.open_checkpoint(step).has_ema


def test_hsdp_shadow_is_the_reference_and_resumes_from_fsdp2(hsdp_runs: Path) -> None:
    """HSDP 2x2: each rank holds its shard of a replicated group's parameters; both saved forms equal
    the reference, and FSDP2 on 2 ranks -> HSDP 2x2 continues the FSDP2 shadow."""
    reference = load_file(hsdp_runs / "hsdp" / "reference_ema.safetensors")
    step = hsdp_runs / "hsdp" / "checkpoints" / "000004"
    assert_equal(ckpt_tools.load_model_state_dict(step, weights="ema"), reference)
    assert ckpt_tools.verify_checkpoint(step, deep=True).ok  # ema.safetensors and ema_dcp/ agree
    got, want = final_ema(hsdp_runs, "fsdp2_to_hsdp"), final_ema(hsdp_runs, "fsdp2")
    for name, tensor in want.items():
        torch.testing.assert_close(got[name], tensor, rtol=1e-5, atol=1e-7)


def test_hsdp_with_checkpointing_and_compile_is_the_plain_hsdp_run(hsdp_runs: Path) -> None:
    """HSDP 2x2 with every wrap unit checkpointed and compiled: the same weights and EMA bit for bit,
    saved under the plain policy's names in both formats (no `_orig_mod.`, no checkpoint wrapper)."""
    from ckpt_tools.tensors.tensor_io import read_dcp_full

    log = (hsdp_runs / "hsdp_launch.log").read_text()
    assert "torch.compile: 2 units, backend aot_eager" in log and "activation checkpointing: 2 units" in log
    plain, fast = (hsdp_runs / run / "checkpoints" / "000004" for run in ("hsdp", "hsdp_compiled"))
    assert_equal(ckpt_tools.load_model_state_dict(fast), ckpt_tools.load_model_state_dict(plain))
    assert_equal(final_ema(hsdp_runs, "hsdp_compiled"), final_ema(hsdp_runs, "hsdp"))
    shards = read_dcp_full(str(fast / "pretrained_model" / "pytorch_model_fsdp_0"))
    assert_equal(shards, read_dcp_full(str(plain / "pretrained_model" / "pytorch_model_fsdp_0")))
    assert not any("_orig_mod" in name or "checkpoint_wrapped" in name for name in shards)


def test_the_end_of_run_rollouts_say_they_score_the_ema(runs: Path) -> None:
    """Only the ddp run rolls out (--dataset.eval_episodes=2); the main rank says so once."""
    assert (runs / "launch.log").read_text().count(
        "evaluating the EMA weights (--ema.use_for_eval=true)"
    ) == 1


def test_ddp_and_fsdp2_keep_the_same_shadow(runs: Path) -> None:
    """The same global batch and seed: the same trajectory, so the same EMA (within fp32 reduction order)."""
    ddp, fsdp2 = final_ema(runs, "ddp"), final_ema(runs, "fsdp2")
    for name, tensor in ddp.items():
        torch.testing.assert_close(fsdp2[name], tensor, rtol=1e-5, atol=1e-7)


def test_resume_on_the_same_topology_continues_the_shadow_bit_exact(runs: Path) -> None:
    assert_equal(final_ema(runs, "fsdp2_r"), final_ema(runs, "fsdp2"))


def test_fsdp2_resumes_the_ddp_shadow(runs: Path) -> None:
    """DDP -> FSDP2 on 2 ranks: each rank reads its shard's rows of the gathered ema.safetensors."""
    got, want = final_ema(runs, "ddp_to_fsdp2"), final_ema(runs, "ddp")
    for name, tensor in want.items():
        torch.testing.assert_close(got[name], tensor, rtol=1e-5, atol=1e-7)


def test_load_policy_and_eval_take_the_ema_by_default(runs: Path) -> None:
    from trainer.cli.eval_command import run_eval
    from trainer.evaluation.inference import load_policy

    step = runs / "ddp" / "checkpoints" / "000004"
    ema, model = final_ema(runs, "ddp"), ckpt_tools.load_model_state_dict(step)
    loaded = load_policy(str(step))
    assert loaded.weights == "ema"
    assert_equal({k: v.detach() for k, v in loaded.policy.state_dict().items()}, ema)
    trained = load_policy(str(step), weights="model")
    assert_equal({k: v.detach() for k, v in trained.policy.state_dict().items()}, model)
    result = run_eval(
        [f"--policy.path={step}", f"--dataset.cache_dir={runs}/cache", "--dataset.eval_episodes=1"]
    )
    assert result["weights"] == "ema"


def test_peft_averages_the_adapters_only(runs: Path) -> None:
    """LoRA under FSDP2: the shadow holds the trainable (adapter) parameters' shards, saved under the
    adapter file's key names in both forms; the EMA policy is the base with the EMA adapters merged."""
    from ckpt_tools.state.adapters import peft_key
    from trainer.evaluation.inference import load_policy

    reference = {
        peft_key(name): t for name, t in load_file(runs / "peft" / "reference_ema.safetensors").items()
    }
    step = runs / "peft" / "checkpoints" / "000004"
    adapter = ckpt_tools.load_model_state_dict(step)
    assert reference.keys() == adapter.keys() and any("lora_A" in name for name in reference)
    assert_equal(ckpt_tools.load_model_state_dict(step, weights="ema"), reference)
    model_dir = step / "pretrained_model"
    assert (model_dir / layout.EMA_SAFETENSORS).exists() and (model_dir / layout.EMA_DCP_DIR).exists()
    assert ckpt_tools.verify_checkpoint(step, deep=True).ok
    ema_policy, trained_policy = load_policy(str(step)), load_policy(str(step), weights="model")
    assert (ema_policy.weights, trained_policy.weights) == ("ema", "model")
    ema_state, trained_state = ema_policy.policy.state_dict(), trained_policy.policy.state_dict()
    assert not torch.equal(ema_state["blocks.0.linear.weight"], trained_state["blocks.0.linear.weight"])
    assert torch.equal(ema_state["inp.weight"], trained_state["inp.weight"])  # frozen: the base's
    assert_equal(final_ema(runs, "peft_r"), final_ema(runs, "peft"))  # a resume continues it bit for bit


def test_convert_turns_the_ema_shards_into_ema_safetensors(runs: Path, tmp_path: Path) -> None:
    """`ckpt convert --weights ema --delete-dcp` on a copy of the FSDP2 step: ema_dcp/ becomes
    ema.safetensors (the same tensors), the model's shards and checkpoint_format stay as they were."""
    step = tmp_path / "000004"
    shutil.copytree(runs / "fsdp2" / "checkpoints" / "000004", step)
    before = ckpt_tools.load_model_state_dict(step, weights="ema")
    result = subprocess.run(
        [str(CKPT_CLI), "convert", str(step), "--weights", "ema", "--delete-dcp"],
        env=launch_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout
    model_dir = step / "pretrained_model"
    assert not (model_dir / layout.EMA_DCP_DIR).exists() and (model_dir / layout.MODEL_DCP_DIR).exists()
    converted = load_file(model_dir / layout.EMA_SAFETENSORS)
    assert converted.keys() == before.keys()  # the MLP has no buffers: the model's tensors are parameters
    assert_equal(converted, before)
    assert ckpt_tools.read_training_step(step).checkpoint_format == "dcp"
    assert ckpt_tools.verify_checkpoint(step, deep=True).ok


def test_one_process_resumes_the_fsdp2_shadow(runs: Path) -> None:
    """FSDP2 on 2 ranks -> 1 process: the DCP shadow resharded into plain tensors. Had it been lost,
    the shadow would restart from the step-2 weights and end ~1e-4 away from the uninterrupted run's."""
    config = model_file(runs / "fsdp2", 2, "train_config.json")
    out = runs / "single"
    result = subprocess.run(
        [
            sys.executable,
            str(SCRIPTS / "train_cli.py"),
            "--resume=true",
            f"--config_path={config}",
            f"--output_dir={out}",
            "--parallelism.dp_shard=1",
            "--batch_size=16",
            "--async_save=false",
        ],
        env=launch_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout
    assert "holds no EMA weights" not in result.stdout
    got, want = final_ema(runs, "single"), final_ema(runs, "fsdp2")
    for name, tensor in want.items():
        torch.testing.assert_close(got[name], tensor, rtol=1e-5, atol=1e-7)
