"""PEFT in one process: `--peft.*` and `--policy.path` parsing, the PEFT model the trainer builds (targets,
frozen base, dtypes, ignored_modules), adapter checkpoints through ckpt_tools, and a LoRA run resumed."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import pytest
import torch

import ckpt_tools
from ckpt_tools.format.meta import Topology, TrainingStep
from ckpt_tools.state.adapters import peft_key
from helpers import tiny_run
from helpers.run_outputs import model_file
from helpers.train_flags import tiny_args
from trainer.cli.parse import parse_config
from trainer.config.peft import PeftConfig
from trainer.engine.peft_policy import adapter_config, start_policy
from trainer.engine.plan import policy_section, resolve_accelerator, train
from trainer.errors import ConfigError
from trainer.policies.act.state import ACTStateConfig
from trainer.policies.common.base import build_policy

TINY_ACT = {"dim": 16, "heads": 2, "ffn_dim": 32, "encoder_layers": 1, "decoder_layers": 1, "chunk": 4}


def tiny_act(seed: int = 0, **overrides) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_policy(ACTStateConfig(**{**TINY_ACT, **overrides}), 3, 1)


def training_step(step: int, checkpoint_format: str = "safetensors", peft: bool = True) -> TrainingStep:
    """The one-process step record of helpers.tiny_run, marked as a PEFT run (or not)."""
    return dataclasses.replace(tiny_run.training_step(step, checkpoint_format), peft=peft)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A freshly initialised tiny ACT saved through ckpt_tools: the base policy of these tests."""
    policy = tiny_act(seed=1)
    root = tmp_path_factory.mktemp("base") / "checkpoints"
    step = ckpt_tools.training.save_checkpoint(
        ckpt_tools.training.SaveRequest(
            checkpoints_dir=root,
            training_step=training_step(0, peft=False),
            model=policy,
            optimizer=torch.optim.AdamW(policy.parameters()),
            policy_config=policy.config.to_dict(),
            train_config={},
        )
    )
    return Path(step)


def peft_config(args: list[str], base: Path | None = None) -> object:
    path = [f"--policy.path={base}"] if base is not None else ["--policy.type=act_state"]
    return parse_config([*path, "--peft.method_type=lora", "--peft.r=4", *args])


def lora_policy(config, seed: int = 0, is_sharded: bool = False) -> torch.nn.Module:
    torch.manual_seed(seed)
    policy = build_policy(config.policy, 3, 1)
    return start_policy(policy, policy_section(config), is_sharded)


# ------------------------------------------------------------------------------------------ flags


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--peft.method_type=IA3", "--peft.method_type='IA3' is not supported"),
        ("--peft.r=0", "--peft.r must be >= 1"),
        ("--peft.alpha=0", "--peft.alpha must be > 0"),
        ("--peft.dropout=1.0", "--peft.dropout must be in [0, 1)"),
        ("--peft.target_modules=[]", "--peft.target_modules is empty"),
    ],
)
def test_bad_peft_flags_name_the_flag(flag, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_config([flag])


def test_peft_is_off_by_default_and_method_is_case_insensitive():
    assert not parse_config([]).peft.enabled
    assert PeftConfig(method_type="lora").method_type == "LORA"


def test_policy_path_supplies_the_policy_config_and_flags_override_it(base):
    config = parse_config([f"--policy.path={base}", "--policy.dropout=0"])
    assert (config.policy.type, config.policy.dim, config.policy.chunk) == ("act_state", 16, 4)
    assert config.policy.dropout == 0 and config.policy.path == str(base)
    with pytest.raises(ConfigError, match=r"holds a act_state policy: drop --policy\.type"):
        parse_config([f"--policy.path={base}", "--policy.type=mlp"])


def test_policy_path_that_is_neither_a_directory_nor_a_reachable_repo(monkeypatch, tmp_path):
    with pytest.raises(ConfigError, match="no such directory"):
        parse_config([f"--policy.path={tmp_path}/missing/dir"])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ConfigError, match="the Hub repo could not be downloaded"):
        parse_config(["--policy.path=someone/no-such-policy"])


# ------------------------------------------------------------------------------ the PEFT model


def test_lora_freezes_the_loaded_base_and_trains_the_default_targets(base):
    config = peft_config([], base)
    model = lora_policy(config, seed=5)  # another init: the base weights must come from --policy.path
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_" in n for n in trainable)
    assert {n.split(".lora_")[0].rsplit(".", 1)[1] for n in trainable} == {"q", "kv", "out"}
    saved = ckpt_tools.load_model_state_dict(base)
    for name, tensor in model.state_dict().items():
        if ".lora_" not in name:
            plain = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
            assert torch.equal(tensor, saved[plain]), name
    assert adapter_config(model, config.policy.path)["base_model_name_or_path"] == os.path.realpath(base)


def test_saved_keys_follow_peft_naming():
    from peft import get_peft_model_state_dict

    for args in (["--peft.full_training_modules=[head.1]"], ["--policy.type=mlp"]):
        config = parse_config(["--peft.method_type=LORA", *args])
        model = lora_policy(config)
        ours = {peft_key(n) for n, p in model.named_parameters() if p.requires_grad}
        assert ours == set(get_peft_model_state_dict(model))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--peft.target_modules=[nope]"], "does not fit ACTStatePolicy"),
        (["--peft.full_training_modules=[nope]"], "names 'nope', which ACTStatePolicy does not have"),
    ],
)
def test_targets_that_do_not_exist_are_refused(args, message):
    with pytest.raises(ConfigError, match=message):
        lora_policy(peft_config(args))


def test_ignored_modules_match_with_or_without_the_peft_prefix():
    for pattern in ("obs_proj", r"base_model\.model\.obs_proj"):
        parsed = peft_config([f"--accelerator.fsdp.ignored_modules={pattern}"])
        config = parsed.derive(accelerator=resolve_accelerator(parsed, Topology(dp_shard=2)))  # as planned
        assert parsed.accelerator.fsdp.ignored_modules == pattern  # the parsed config is not edited
        model = lora_policy(config, is_sharded=True)
        regex = re.compile(config.accelerator.fsdp.ignored_modules)
        assert [n for n, _ in model.named_modules() if regex.fullmatch(n)] == ["base_model.model.obs_proj"]
    with pytest.raises(ConfigError, match="matches no module of the PEFT model"):
        lora_policy(peft_config(["--accelerator.fsdp.ignored_modules=nothing"]), is_sharded=True)
    with pytest.raises(ConfigError, match="keeps trainable parameters out of FSDP"):
        lora_policy(peft_config([r"--accelerator.fsdp.ignored_modules=encoder\.0\.attn\.q"]), is_sharded=True)


def test_low_precision_base_one_dtype_per_unit():
    args = ["--policy.dtype=bfloat16", "--peft.full_training_modules=[head.1]"]
    with pytest.raises(ConfigError, match="FSDP2 needs one dtype per unit"):
        lora_policy(peft_config(args), is_sharded=True)
    model = lora_policy(peft_config([*args, "--accelerator.mixed_precision=bf16"]), is_sharded=True)
    dtypes = {p.requires_grad: set() for p in model.parameters()}
    for param in model.parameters():
        dtypes[param.requires_grad].add(param.dtype)
    assert dtypes == {True: {torch.float32}, False: {torch.bfloat16}}


# --------------------------------------------------------------------------- adapter checkpoints


def _train_a_little(model: torch.nn.Module) -> torch.optim.Optimizer:
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.05)
    obs = torch.randn(8, 3, generator=torch.Generator().manual_seed(0))
    for _ in range(2):
        model.base_model.model._predict(obs).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return optimizer


@pytest.mark.parametrize("checkpoint_format", ["safetensors", "safetensors_dcp"])
def test_adapter_checkpoint_round_trip(tmp_path, checkpoint_format):
    config = peft_config(["--peft.full_training_modules=[head.1]"])
    model = lora_policy(config)
    optimizer = _train_a_little(model)
    step = ckpt_tools.training.save_checkpoint(
        ckpt_tools.training.SaveRequest(
            checkpoints_dir=tmp_path / "checkpoints",
            training_step=training_step(2, checkpoint_format),
            model=model,
            optimizer=optimizer,
            policy_config=config.policy.to_dict(),
            train_config={},
            adapter_config=adapter_config(model, config.policy.path),
        )
    )
    model_dir = Path(step) / "pretrained_model"
    assert not (model_dir / "model.safetensors").exists()
    assert json.loads((model_dir / "adapter_config.json").read_text())["modules_to_save"] == ["head.1"]
    formats = {
        "safetensors": ("adapter safetensors",),
        "safetensors_dcp": ("adapter safetensors", "adapter dcp"),
    }
    assert ckpt_tools.open_checkpoint(step).formats == formats[checkpoint_format]
    if checkpoint_format == "safetensors_dcp":
        (model_dir / "adapter_model.safetensors").unlink()  # the DCP shards alone load too

    fresh = lora_policy(config, seed=9)
    fresh_opt = torch.optim.AdamW([p for p in fresh.parameters() if p.requires_grad], lr=0.05)
    frozen_before = {
        n: t.clone()
        for n, t in fresh.state_dict().items()
        if ".lora_" not in n and "modules_to_save" not in n
    }
    ckpt_tools.training.load_training_state(step, model=fresh, optimizer=fresh_opt)
    got, want = fresh.state_dict(), model.state_dict()
    for name, tensor in want.items():
        expected = frozen_before.get(name, tensor)  # the base is whatever the run built, never the file's
        assert torch.equal(got[name], expected), name
    assert fresh_opt.state_dict()["state"].keys() == optimizer.state_dict()["state"].keys()

    other = lora_policy(peft_config(["--peft.target_modules=[q]"]))
    with pytest.raises(ckpt_tools.CheckpointError) as refused:
        ckpt_tools.training.load_training_state(step, model=other)
    assert str(refused.value) == (  # names the first of the sorted differences
        f"{model_dir}: the adapter holds 26 tensors, this model trains 8 "
        "(base_model.model.decoder.0.cross_attn.kv.lora_A.weight is in only one of them); "
        "build the model with the --peft settings the adapter was trained with"
    )
    # An adapter holding fewer tensors than the model trains is refused too (none left as built).
    fewer = ckpt_tools.training.save_checkpoint(
        ckpt_tools.training.SaveRequest(
            checkpoints_dir=tmp_path / "fewer",
            training_step=training_step(2, checkpoint_format),
            model=other,
            optimizer=torch.optim.AdamW([p for p in other.parameters() if p.requires_grad]),
            policy_config=config.policy.to_dict(),
            train_config={},
            adapter_config=adapter_config(other, config.policy.path),
        )
    )
    with pytest.raises(
        ckpt_tools.CheckpointError, match="the adapter holds 8 tensors, this model trains 26 "
    ):
        ckpt_tools.training.load_training_state(fewer, model=fresh)


# ------------------------------------------------------------------------------------- the loop


def test_lora_run_on_mlp_resumes_exactly(tmp_path, dataset_cache, clean_accelerate):
    from accelerate.state import AcceleratorState

    base_run = tiny_args(str(tmp_path / "base"), dataset_cache, "--policy.type=mlp", "--steps=2")
    base = train(parse_config(base_run)).last_checkpoint
    AcceleratorState._reset_state(reset_partial_state=True)
    lora = [
        "--peft.method_type=LORA",
        "--peft.r=2",
        "--policy.dropout=0",
        "--use_policy_training_preset=false",
        "--optimizer.lr=0.01",
        "--log_freq=1",
    ]
    first = train(parse_config(tiny_args(str(tmp_path / "a"), dataset_cache, f"--policy.path={base}", *lora)))
    AcceleratorState._reset_state(reset_partial_state=True)
    saved = model_file(tmp_path / "a", 2, "train_config.json")
    resumed = train(
        parse_config([f"--config_path={saved}", "--resume=true", f"--output_dir={tmp_path / 'b'}"])
    )
    assert resumed.final_loss == first.final_loss
    a = ckpt_tools.load_model_state_dict(first.last_checkpoint)
    b = ckpt_tools.load_model_state_dict(resumed.last_checkpoint)
    assert a.keys() == b.keys() and all(".lora_" in k for k in a) and all(torch.equal(a[k], b[k]) for k in a)
