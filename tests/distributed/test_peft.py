"""LoRA fine-tuning of the built-in `act` policy under FSDP2 2, DDP 2 and HSDP 2x2 (gloo), through the
real trainer: only the adapters (and full-training copies) move, the saved adapter is the gathered
trainable weights bit for bit in every checkpoint format, a resume continues the loss curve on the same
and on changed topologies, and a merged model computes what base + adapter computes.

One torchrun launch per topology for the whole session (scripts/peft_run.py says what each one runs).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

import ckpt_tools
from ckpt_tools.state.adapters import PEFT_PREFIX, peft_key
from ckpt_tools.tensors.tensor_io import read_dcp_full, read_safetensors
from helpers.launch import run_torchrun
from helpers.run_outputs import metrics

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]

SCRIPT = Path(__file__).parent / "scripts" / "peft_run.py"
# (case, run, step) of every checkpoint the launches write after LoRA training.
SAVES = [("fsdp2", "a", 4), ("fsdp2", "r", 4), ("fsdp2", "bf16", 2), ("ddp2", "x", 4), ("hsdp2x2", "x", 4)]
FORMATS = {"a": "dcp", "r": "dcp", "bf16": "safetensors"}  # the fsdp2 runs; ddp/hsdp below
CASE_FORMATS = {"ddp2": "safetensors", "hsdp2x2": "safetensors_dcp"}


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("peft_runs")
    for case, nproc in (("fsdp2", 2), ("ddp2", 2), ("hsdp2x2", 4)):  # fsdp2 first: it writes the base
        run_torchrun(SCRIPT, nproc, str(out), case, timeout=280)
    return out


def base_dir(runs: Path) -> Path:
    return runs / "fsdp2" / "base" / "checkpoints" / "000002"


def step_dir(runs: Path, case: str, run: str, step: int) -> Path:
    return runs / case / run / "checkpoints" / f"{step:06d}"


def spy(runs: Path, case: str, run: str, step: int) -> dict:
    return torch.load(runs / case / run / "spy" / f"{step}.pt", weights_only=True)


def base_name(peft_name: str) -> str:
    """The base model's name of a frozen tensor of the PEFT model."""
    name = peft_name.removeprefix(PEFT_PREFIX)
    return name.replace(".base_layer.", ".").replace(".original_module.", ".")


def saved_adapter(runs: Path, case: str, run: str, step: int) -> dict[str, dict[str, torch.Tensor]]:
    """Every adapter file the checkpoint holds, by format."""
    model_dir = step_dir(runs, case, run, step) / "pretrained_model"
    found = {}
    if (model_dir / "adapter_model.safetensors").exists():
        found["safetensors"] = read_safetensors(str(model_dir / "adapter_model.safetensors"))[0]
    if (model_dir / "adapter_model_fsdp_0").exists():
        found["dcp"] = read_dcp_full(str(model_dir / "adapter_model_fsdp_0"))
    return found


def losses(runs: Path, case: str, run: str) -> dict[int, float]:
    records = metrics(runs / case / run)
    return {r["step"]: r["loss"] for r in records if r.get("event") == "train"}


@pytest.mark.parametrize(("case", "run", "step"), SAVES)
def test_frozen_base_is_untouched_and_only_adapters_train(runs, case, run, step):
    base = ckpt_tools.load_model_state_dict(base_dir(runs))
    seen = spy(runs, case, run, step)
    trainable = seen["trainable"]
    assert trainable and all(".lora_" in n or ".modules_to_save." in n for n in trainable)
    frozen = {name: t for name, t in seen["state"].items() if name not in trainable}
    assert {base_name(n) for n in frozen} == set(base)
    for name, tensor in frozen.items():
        want = base[base_name(name)].to(tensor.dtype)
        assert torch.equal(tensor, want), name
    held = set(seen["frozen_layout"].values())
    if case == "ddp2":
        assert held == {"full"}
    elif run == "bf16":  # only the ignored module (matched without the PEFT prefix) is kept whole
        full = {n for n, how in seen["frozen_layout"].items() if how == "full"}
        assert full == {"base_model.model.obs_proj.weight", "base_model.model.obs_proj.bias"}
    else:  # FSDP2 / HSDP: every rank holds only its share of the frozen base
        assert held == {"shard"}
    if run == "bf16":  # bf16 base stays bf16; every trainable parameter (adapter and head copy) is fp32
        assert {t.dtype for t in frozen.values()} == {torch.bfloat16}
        assert set(trainable.values()) == {torch.float32}
        assert any(".modules_to_save." in n for n in trainable)
        return
    before = saved_adapter(runs, "fsdp2", "a", 2)["dcp"]  # every run trained on from this step-2 adapter
    for name in trainable:
        assert not torch.equal(seen["state"][name], before[peft_key(name)]), f"{name} did not train"


@pytest.mark.parametrize(("case", "run", "step"), SAVES)
def test_saved_adapter_is_the_gathered_trainable_weights(runs, case, run, step):
    seen = spy(runs, case, run, step)
    want = {peft_key(name): seen["state"][name] for name in seen["trainable"]}
    files = saved_adapter(runs, case, run, step)
    fmt = CASE_FORMATS.get(case) or FORMATS[run]
    assert (
        sorted(files)
        == {"safetensors": ["safetensors"], "dcp": ["dcp"], "safetensors_dcp": ["dcp", "safetensors"]}[fmt]
    )
    for tensors in files.values():
        assert tensors.keys() == want.keys()
        for key, tensor in want.items():
            assert tensor.dtype == tensors[key].dtype and torch.equal(tensor, tensors[key]), key
    model_dir = step_dir(runs, case, run, step) / "pretrained_model"
    assert (
        not (model_dir / "model.safetensors").exists() and not (model_dir / "pytorch_model_fsdp_0").exists()
    )
    config = json.loads((model_dir / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == os.path.realpath(
        runs / "fsdp2" / "base" / "checkpoints" / "last"
    )
    assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", 4, 8)
    assert ckpt_tools.read_training_step(step_dir(runs, case, run, step)).peft is True


def test_same_topology_resume_is_exact(runs):
    a, r = losses(runs, "fsdp2", "a"), losses(runs, "fsdp2", "r")
    assert sorted(r) == [3, 4] and all(r[s] == a[s] for s in r)
    uninterrupted = saved_adapter(runs, "fsdp2", "a", 4)["dcp"]
    resumed = saved_adapter(runs, "fsdp2", "r", 4)["dcp"]
    assert all(torch.equal(uninterrupted[k], resumed[k]) for k in uninterrupted)


@pytest.mark.parametrize("case", ["ddp2", "hsdp2x2"])
def test_changed_topology_resume_continues_the_loss_curve(runs, case):
    a, x = losses(runs, "fsdp2", "a"), losses(runs, case, "x")
    assert sorted(x) == [3, 4]
    for step in x:  # same global batch: the same samples, summed in another order
        assert x[step] == pytest.approx(a[step], rel=1e-5)
    uninterrupted = saved_adapter(runs, "fsdp2", "a", 4)["dcp"]
    resumed = saved_adapter(runs, case, "x", 4)["safetensors"]
    for key, tensor in uninterrupted.items():  # Adam turns a sum's last bits into ~lr-sized steps on
        # near-zero gradients: a few elements differ by some 1e-6 (how many depends on the base's draw)
        torch.testing.assert_close(resumed[key], tensor, rtol=1e-4, atol=1e-5)


def _policy(config_dir: Path) -> torch.nn.Module:
    from trainer.policies.common.base import PolicyConfig, build_policy

    saved = json.loads((config_dir / "config.json").read_text())
    cls = PolicyConfig.get_choice_class(saved.pop("type"))
    return build_policy(cls(**{k: v for k, v in saved.items()}), 0, 0).eval()


def test_merged_model_computes_what_base_plus_adapter_computes(runs, tmp_path):
    """The DCP adapter converts with `ckpt convert`, merges with `ckpt merge-adapter`, and the merged
    policy's actions equal those of the base policy with the adapter applied by peft."""
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
    from typer.testing import CliRunner

    from ckpt_tools.cli import app as cli_app

    if not cli_app.app.registered_commands:
        cli_app._register()
    adapter_dir = tmp_path / "pretrained_model"
    shutil.copytree(step_dir(runs, "fsdp2", "a", 4) / "pretrained_model", adapter_dir)
    result = ckpt_tools.convert_dcp_to_safetensors(adapter_dir)
    converted = read_safetensors(str(adapter_dir / "adapter_model.safetensors"))[0]
    assert [Path(p).name for p in result.files] == ["adapter_model.safetensors"]
    dcp = read_dcp_full(str(adapter_dir / "adapter_model_fsdp_0"))
    assert converted.keys() == dcp.keys() and all(torch.equal(converted[k], dcp[k]) for k in dcp)

    cli = CliRunner().invoke(
        cli_app.app, ["merge-adapter", str(adapter_dir), "--output", str(tmp_path / "merged")]
    )
    assert cli.exit_code == 0, cli.output
    merged = _policy(adapter_dir)
    merged.load_state_dict(read_safetensors(str(tmp_path / "merged" / "model.safetensors"))[0])

    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    base = _policy(adapter_dir)
    base.load_state_dict(ckpt_tools.load_model_state_dict(base_dir(runs)))
    lora = LoraConfig(r=config["r"], lora_alpha=config["lora_alpha"], target_modules=config["target_modules"])
    with_adapter = get_peft_model(base, lora).eval()
    set_peft_model_state_dict(with_adapter, converted)
    obs = {"observation.state": torch.randn(16, 3, generator=torch.Generator().manual_seed(0))}
    with torch.no_grad():
        want = with_adapter.select_action(obs)
        got = merged.select_action(obs)
    assert not torch.equal(want, _policy_on_base(runs, adapter_dir).select_action(obs))  # the adapter matters
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def _policy_on_base(runs: Path, config_dir: Path) -> torch.nn.Module:
    policy = _policy(config_dir)
    policy.load_state_dict(ckpt_tools.load_model_state_dict(base_dir(runs)))
    return policy


def test_adapter_checkpoint_is_usable_as_policy_path(runs):
    """`--policy.path` on a PEFT checkpoint (any format) starts from base + merged adapter."""
    from trainer.policies.common.pretrained import load_weights

    adapter = step_dir(runs, "hsdp2x2", "x", 4)
    policy = _policy(adapter / "pretrained_model")
    load_weights(policy, str(adapter))
    want = ckpt_tools.merge_adapter_dir(base_dir(runs), adapter)
    got = policy.state_dict()
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
