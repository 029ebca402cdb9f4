"""Activation checkpointing and torch.compile: same arithmetic, same checkpoint keys, resume across them.

The training runs compile with the aot_eager backend: it traces and compiles through AOTAutograd like
inductor but runs eager kernels, so the results are comparable bit for bit with a plain run (inductor's
fused kernels round differently) and the runs do not wait for a C++ build. One test compiles with
inductor itself (g++ is there), to the eager numbers up to rounding.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from ckpt_tools.tensors.tensor_io import read_safetensors
from helpers.train_flags import tiny_args
from trainer.cli.parse import parse_config
from trainer.config.accelerator import AcceleratorConfig
from trainer.distributed.units import apply_unit_transforms
from trainer.distributed.wrap import WrapPlan
from trainer.engine.plan import train
from trainer.errors import ConfigError
from trainer.evaluation.inference import load_policy
from trainer.policies import build_policy
from trainer.policies.mlp import MLPConfig

FAST = (
    "--accelerator.activation_checkpointing=true",
    "--accelerator.compile=true",
    "--accelerator.compile_backend=aot_eager",
)


def run(out: Path, cache: str, *extra: str) -> Path:
    """A 4-step MLP run with dropout (so checkpointing must replay the RNG); returns its last step dir."""
    args = tiny_args(str(out), cache, "--policy.type=mlp", "--policy.hidden_dim=16", "--policy.dropout=0.2")
    return Path(train(parse_config([*args, *extra])).last_checkpoint)


def weights(step_dir: Path) -> dict[str, torch.Tensor]:
    return read_safetensors(str(step_dir / "pretrained_model" / "model.safetensors"))[0]


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key, tensor in a.items():
        assert torch.equal(tensor, b[key]), key


def test_compiled_checkpointed_run_matches_the_plain_run_and_resumes_across_them(
    tmp_path, dataset_cache, clean_accelerate, capsys
) -> None:
    plain = weights(run(tmp_path / "plain", dataset_cache))
    torch._dynamo.reset()
    fast_dir = run(tmp_path / "fast", dataset_cache, *FAST)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # it did compile
    err = capsys.readouterr().err
    assert "activation checkpointing: 2 units (by class: MLPBlock)" in err
    assert "torch.compile: 2 units, backend aot_eager, mode default" in err
    fast = weights(fast_dir)
    assert not any("_orig_mod" in key or "checkpoint" in key for key in fast)
    assert_same(fast, plain)  # recomputation and the compiled graph change no bit of the update

    loaded = load_policy(str(fast_dir)).policy  # a compiled run's checkpoint in a plain policy
    assert_same({k: v for k, v in loaded.state_dict().items() if k in plain}, plain)

    # 2 steps, then a resume to 4 under the other setting: both continue to the uninterrupted weights
    # (4 steps sit inside the warmup, so the first 2 steps of a 2-step run are those of a 4-step one)
    for first, then, name in (((), FAST, "plain_then_fast"), (FAST, (), "fast_then_plain")):
        out = tmp_path / name
        run(out, dataset_cache, "--steps=2", *first)
        resumed = run(out, dataset_cache, "--resume=true", *then)
        assert resumed.name == "000004"
        assert_same(weights(resumed), plain)


def test_checkpointing_keeps_only_unit_inputs_for_backward() -> None:
    """What checkpointing is for: the activations inside each unit are not kept for backward."""

    def saved_bytes(checkpointing: bool) -> int:
        torch.manual_seed(0)
        policy = build_policy(MLPConfig(hidden_dim=64, blocks=4), obs_dim=3, action_dim=1)
        config = AcceleratorConfig(activation_checkpointing=checkpointing)
        apply_unit_transforms(policy, WrapPlan(("MLPBlock",)), config.unit_settings(), sharded=False)
        total = 0

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            nonlocal total
            total += tensor.numel() * tensor.element_size()
            return tensor

        batch = {"observation.state": torch.randn(256, 3), "action": torch.randn(256, 1, 1)}
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss, _ = policy(batch)
        loss.backward()
        return total

    plain, checkpointed = saved_bytes(False), saved_bytes(True)
    assert checkpointed < plain / 2, (checkpointed, plain)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("compile_mode", "fast", "--accelerator.compile_mode='fast' is not one of default, reduce-overhead"),
        ("compile_scope", "layers", "--accelerator.compile_scope='layers' is not one of units, model"),
    ],
)
def test_bad_compile_values_are_one_line(field: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        AcceleratorConfig(**{field: value})


def test_whole_model_compile_compiles_the_policy_and_is_refused_on_a_sharded_run() -> None:
    policy = build_policy(MLPConfig(hidden_dim=8), obs_dim=3, action_dim=1)
    config = AcceleratorConfig(
        compile=True, compile_scope="model", compile_backend="aot_eager"
    ).unit_settings()
    with pytest.raises(ConfigError, match=re.escape("use --accelerator.compile_scope=units")):
        apply_unit_transforms(policy, WrapPlan(("MLPBlock",)), config, sharded=True)
    lines = apply_unit_transforms(policy, None, config, sharded=False)  # no units needed
    assert lines == ["torch.compile: the whole policy, backend aot_eager, mode default"]
    assert policy._compiled_call_impl is not None
    assert all(block._compiled_call_impl is None for block in policy.blocks)
    assert [k for k, _ in policy.named_parameters()] == [
        k for k, _ in build_policy(MLPConfig(hidden_dim=8), obs_dim=3, action_dim=1).named_parameters()
    ]


def test_inductor_compiles_checkpointed_units_to_the_eager_numbers() -> None:
    """The default backend (inductor: a C++ build on CPU) on checkpointed units: the same loss and
    gradients as eager up to rounding (its fused kernels round differently), the same keys."""

    def loss_and_grads(**flags: object) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        torch.manual_seed(0)
        policy = build_policy(MLPConfig(hidden_dim=16, blocks=2, dropout=0.0), obs_dim=3, action_dim=1)
        apply_unit_transforms(
            policy, WrapPlan(("MLPBlock",)), AcceleratorConfig(**flags).unit_settings(), sharded=False
        )
        generator = torch.Generator().manual_seed(1)
        batch = {
            "observation.state": torch.randn(8, 3, generator=generator),
            "action": torch.randn(8, 1, 1, generator=generator),
        }
        loss, _ = policy(batch)
        loss.backward()
        return loss.detach(), {name: p.grad for name, p in policy.named_parameters()}

    eager_loss, eager_grads = loss_and_grads()
    loss, grads = loss_and_grads(activation_checkpointing=True, compile=True)
    torch.testing.assert_close(loss, eager_loss)
    assert grads.keys() == eager_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, eager_grads[name], msg=name)
