"""The meta-device build (engine/build.py) on one process: every buffer of every built-in policy equals
an eagerly built one's, the initialization is a function of the seed alone, and a plug-in policy that
cannot be built on meta is built eagerly with a one-line note naming the module and the fix."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from trainer.config.peft import PeftConfig
from trainer.config.policy import PolicyConfig
from trainer.config.train import TrainConfig
from trainer.engine import build as model_build
from trainer.engine import peft_policy
from trainer.engine.plan import policy_section
from trainer.policies import build_policy
from trainer.policies.act import ACTConfig
from trainer.policies.act.state import ACTStateConfig
from trainer.policies.common.base import Policy
from trainer.policies.mlp import MLPConfig

CAM = "observation.images.top"
TINY_ACT = {"dim_model": 16, "n_heads": 2, "dim_feedforward": 32, "n_encoder_layers": 1, "n_vae_encoder_layers": 1,
            "latent_dim": 4, "chunk_size": 4, "n_action_steps": 4, "pretrained_backbone_weights": None}  # fmt: skip
POLICIES = {
    # the camera trunk brings frozen batch-norm statistics, the CVAE its sinusoidal table
    "act": ACTConfig(**TINY_ACT, input_features=["observation.state", CAM], image_shapes={CAM: [3, 32, 32]}),
    "act_bf16": ACTConfig(**TINY_ACT, input_features=["observation.state"], dtype="bfloat16"),
    "act_state": ACTStateConfig(dim=16, ffn_dim=24),
    "mlp": MLPConfig(),
}


LORA = PeftConfig(method_type="LORA", r=4, alpha=8)  # act_state's attention projections


def _meta_built(
    policy: PolicyConfig,
    seed: int = 0,
    notes: list[str] | None = None,
    peft: PeftConfig | None = None,
    path: str | None = None,
) -> model_build.BuiltPolicy:
    policy = dataclasses.replace(policy, path=path) if path is not None else policy
    config = TrainConfig(policy=policy, seed=seed, peft=peft or PeftConfig())
    section = policy_section(config)
    built = model_build.build(section, False, 3, 2, [] if notes is None else notes)
    model_build.before_prepare(built, section, torch.device("cpu"))
    return built


@pytest.mark.parametrize("name", list(POLICIES))
def test_every_buffer_equals_the_eager_builds(name: str) -> None:
    built = _meta_built(POLICIES[name])
    assert built.on_meta, "a built-in policy must be built on meta"
    eager = build_policy(POLICIES[name], 3, 2)
    buffers = dict(built.policy.named_buffers())
    assert buffers.keys() == dict(eager.named_buffers()).keys()
    for key, value in eager.named_buffers():
        assert buffers[key].dtype == value.dtype and torch.equal(buffers[key], value), key
    shapes = {k: (v.shape, v.dtype) for k, v in eager.named_parameters()}
    assert {k: (v.shape, v.dtype) for k, v in built.policy.named_parameters()} == shapes
    assert all(p.device.type == "cpu" for p in built.policy.parameters())


def test_initialization_is_a_function_of_the_seed() -> None:
    config = POLICIES["act_state"]
    first, again, other = (_meta_built(config, seed).policy.state_dict() for seed in (3, 3, 4))
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not torch.equal(first["encoder.0.attn.q.weight"], other["encoder.0.attn.q.weight"])
    # each module draws as torch's own init does: a Linear's weights within its kaiming bound
    bound = 1 / 16**0.5
    weight = first["encoder.0.attn.q.weight"]
    assert weight.abs().max() <= bound and weight.std() > bound / 3
    assert 0.015 < first["context"].std() < 0.025  # act_state's own parameter: normal(0, 0.02)


def test_a_lora_run_builds_on_meta_and_its_adapters_start_as_peft_draws_them() -> None:
    """`--peft.*` on a meta-buildable policy: the wrapper is built on meta, each LoRA B starts at zero
    (the adapted policy computes what its base does), each A within its kaiming bound (peft's
    `init_lora_weights=True`), and the same seed gives the same bits, adapters included; the base is
    initialized as a plain run's modules are."""
    built = _meta_built(POLICIES["act_state"], seed=3, peft=LORA)
    assert built.on_meta and built.policy is not built.base
    state = built.policy.state_dict()
    lora_a = {k: v for k, v in state.items() if ".lora_A." in k}
    lora_b = {k: v for k, v in state.items() if ".lora_B." in k}
    assert len(lora_a) == len(lora_b) == 12  # q, kv, out of 4 attentions: 2 encoder layers, the decoder's 2
    assert all(torch.equal(v, torch.zeros_like(v)) for v in lora_b.values())
    for key, value in lora_a.items():
        bound = 1 / value.shape[1] ** 0.5  # kaiming_uniform(a=sqrt(5)) of an r x in matrix
        assert value.abs().max() <= bound and value.std() > bound / 3, key
    q = "base_model.model.encoder.0.attn.q"
    assert not torch.equal(state[f"{q}.lora_A.default.weight"], state[f"{q}.base_layer.weight"][:4])
    again = _meta_built(POLICIES["act_state"], seed=3, peft=LORA).policy.state_dict()
    assert all(torch.equal(state[k], again[k]) for k in state)
    trainable = [name for name, p in built.policy.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_" in name for name in trainable)


def test_a_lora_run_streams_the_base_weights_under_their_names_in_the_wrapper(tmp_path) -> None:
    """`--policy.path` of a LoRA run on meta: the saved base goes into the frozen base (`q.weight` into
    `base_model.model.q.base_layer.weight`), the adapters keep their initialization."""
    from safetensors.torch import save_file

    base = build_policy(POLICIES["act_state"], 3, 2)
    save_file(base.state_dict(), str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text('{"type": "act_state"}')
    built = _meta_built(POLICIES["act_state"], seed=3, peft=LORA, path=str(tmp_path))
    assert built.on_meta
    state, saved = built.policy.state_dict(), base.state_dict()
    names = peft_policy.base_weight_names(built.policy)
    assert names["base_model.model.encoder.0.attn.q.base_layer.weight"] == "encoder.0.attn.q.weight"
    assert sorted(names.values()) == sorted(saved)  # every saved tensor, each once
    assert all(torch.equal(state[inside], saved[name]) for inside, name in names.items())
    fresh = _meta_built(POLICIES["act_state"], seed=3, peft=LORA).policy.state_dict()
    assert all(torch.equal(state[k], fresh[k]) for k in state if ".lora_" in k)


def test_policy_path_tensors_are_never_drawn(tmp_path, monkeypatch) -> None:
    """With `--policy.path` the meta build allocates and draws none of the tensors the checkpoint fills
    (at pi0.5's size: 3.35 B draws, and per rank the token table's full initial values); the policy
    then holds the checkpoint's weights. Without it every Linear is drawn, on the CPU."""
    from safetensors.torch import save_file

    saved = build_policy(POLICIES["act_state"], 3, 2).state_dict()
    save_file(saved, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text('{"type": "act_state"}')
    drawn: list[str] = []
    reset = nn.Linear.reset_parameters

    def watched(linear: nn.Linear) -> None:
        if not linear.weight.is_meta:  # the build's own calls, on meta, draw nothing
            drawn.append(linear.weight.device.type)
        reset(linear)

    monkeypatch.setattr(nn.Linear, "reset_parameters", watched)
    built = _meta_built(POLICIES["act_state"], seed=3, path=str(tmp_path))
    assert built.on_meta and drawn == []
    state = built.policy.state_dict()
    assert state.keys() == saved.keys() and all(torch.equal(state[k], saved[k]) for k in saved)
    _meta_built(POLICIES["act_state"], seed=3)
    assert drawn and set(drawn) == {"cpu"}


@dataclass
class NoResetConfig(PolicyConfig):  # not registered: no other test sees it
    def policy_class(self):  # type: ignore[no-untyped-def]
        return NoResetPolicy


class Scale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.factor = nn.Parameter(torch.ones(3))


class NoResetPolicy(Policy):
    def __init__(self, config: PolicyConfig) -> None:
        super().__init__(config)
        self.body = nn.Sequential(nn.Linear(3, 3), Scale())


@dataclass
class ReadsInInitConfig(PolicyConfig):
    def policy_class(self):  # type: ignore[no-untyped-def]
        return ReadsInInitPolicy


class ReadsInInitPolicy(Policy):
    def __init__(self, config: PolicyConfig) -> None:
        super().__init__(config)
        self.linear = nn.Linear(3, 3)
        self.norm = float(self.linear.weight.norm())  # a value read in __init__: meta has none


def test_a_module_without_reset_parameters_is_built_eagerly_with_a_note() -> None:
    notes: list[str] = []
    built = _meta_built(NoResetConfig(), notes=notes)
    assert not built.on_meta and torch.equal(built.policy.body[1].factor, torch.ones(3))
    assert notes == [
        "Scale at body.1 owns tensors but defines no reset_parameters(), so the policy is built whole on "
        "every rank; define reset_parameters() initializing its own parameters and buffers to build it "
        "sharded (docs/large-models.md)"
    ]


def test_a_policy_reading_values_in_init_is_built_eagerly_with_a_note() -> None:
    notes: list[str] = []
    built = _meta_built(ReadsInInitConfig(), notes=notes)
    assert not built.on_meta and built.policy.norm > 0
    assert len(notes) == 1 and notes[0].startswith(
        "ReadsInInitPolicy: the policy could not be built on the meta device ("
    )
    assert "do them in reset_parameters()" in notes[0] and "\n" not in notes[0]


def test_policy_path_weights_of_another_shape_are_refused_from_the_headers(tmp_path) -> None:
    """`--policy.path` is checked against the policy while it is still on meta: one line naming the
    first tensor that differs, before anything is allocated or read."""
    from safetensors.torch import save_file

    from trainer.errors import ConfigError
    from trainer.policies.common import pretrained

    meta = model_build.build_policy_on_meta(policy_section(TrainConfig(policy=POLICIES["act_state"])), 3, 2)
    state = {name: torch.zeros(t.shape) for name, t in meta.state_dict().items()}
    state["context"] = torch.zeros(3, 16)  # the policy's is (2, 16)
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ConfigError) as refused:
        pretrained.check_fits(meta, str(tmp_path), pretrained.saved_shapes(str(tmp_path)))
    assert str(refused.value) == (
        f"--policy.path={tmp_path}: its weights do not fit the ACTStatePolicy built from the flags "
        "(0 missing, 0 unexpected, 1 resized; context is [3, 16] there but [2, 16] here): drop the "
        "--policy.* flags that change its shape"
    )
    assert all(t.is_meta for t in meta.state_dict().values())


def test_smolva_builds_on_meta_with_transformers_initialization() -> None:
    """SmolVLA's transformers modules (RMSNorm and RoPE without `reset_parameters()`) are initialized
    by transformers' own initializer, so the policy builds on meta: its RoPE tables equal an eager
    build's, norms start at one, the VLM's linears draw normal(0, initializer_range) as a fresh
    SmolVLA does, and the cross-attention projections LeRobot replaces keep torch's draw."""
    from helpers.fixtures import fixture_dir
    from trainer.policies.smolvla.config import SmolVLAConfig

    backbone = str(fixture_dir("lerobot_smolvla_tiny", "tiny_smolvlm"))
    features = ["observation.state", CAM, "task"]
    config = SmolVLAConfig(vlm_model_name=backbone, input_features=features, num_vlm_layers=4)
    built = _meta_built(config, seed=5)
    assert built.on_meta, "SmolVLA with random backbone weights must be built on meta"
    eager = build_policy(config, 3, 2)
    buffers = dict(built.policy.named_buffers())
    assert buffers.keys() == dict(eager.named_buffers()).keys() and buffers
    assert all(torch.equal(buffers[k], v) for k, v in eager.named_buffers())
    state = built.policy.state_dict()
    vlm = "model.vlm_with_expert.vlm.model.text_model.layers.0"
    assert torch.equal(state[f"{vlm}.input_layernorm.weight"], torch.ones(64))
    assert 0.015 < state[f"{vlm}.mlp.up_proj.weight"].std() < 0.025  # transformers' normal(0, 0.02)
    cross_k = state["model.vlm_with_expert.lm_expert.layers.1.self_attn.k_proj.weight"]  # replaced: torch's
    assert cross_k.abs().max() <= 1 / cross_k.shape[1] ** 0.5 and cross_k.std() > 0.05
    again = _meta_built(config, seed=5).policy.state_dict()
    assert all(torch.equal(state[k], again[k]) for k in state)


def test_smolvla_lora_builds_on_meta_with_each_module_initialized_by_its_own_rule() -> None:
    """SmolVLA with LoRA on its default targets (the case a LoRA fine-tune hits most): built on meta,
    the wrapped VLM linears still drawn by transformers' initializer, the adapters as peft draws them."""
    from helpers.fixtures import fixture_dir
    from trainer.policies.smolvla.config import SmolVLAConfig

    backbone = str(fixture_dir("lerobot_smolvla_tiny", "tiny_smolvlm"))
    features = ["observation.state", CAM, "task"]
    config = SmolVLAConfig(vlm_model_name=backbone, input_features=features, num_vlm_layers=4)
    built = _meta_built(config, seed=5, peft=PeftConfig(method_type="LORA", r=2))
    assert built.on_meta, "SmolVLA with LoRA must be built on meta"
    state = built.policy.state_dict()
    lora_b = [v for k, v in state.items() if ".lora_B." in k]
    assert lora_b and all(not b.any() for b in lora_b)
    adapted = [
        k.removesuffix(".lora_A.default.weight") for k in state if k.endswith(".lora_A.default.weight")
    ]
    base = state[f"{adapted[0]}.base_layer.weight"]
    assert 0.015 < base.std() < 0.025  # transformers' normal(0, 0.02), as in a plain SmolVLA
    lora_a = state[f"{adapted[0]}.lora_A.default.weight"]
    assert lora_a.abs().max() <= 1 / lora_a.shape[1] ** 0.5 and lora_a.std() > 0
