"""ACT as LeRobot builds it: the camera trunk against an independent computation with the same
torchvision-named weights, its weight sources, LeRobot's field names, the action queue and temporal
ensembling, the frame checks and the backbone's optimizer group."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from helpers.fixtures import fixture_dir
from trainer.errors import ConfigError
from trainer.policies import build_policy
from trainer.policies.act import ACTConfig, ACTPolicy, TemporalEnsembler, sinusoidal_2d
from trainer.policies.common.base import optimizer_params
from trainer.policies.common.resnet import ResNetTrunk, load_pretrained

CAM = "observation.images.top"
TINY = {
    "dim_model": 16,
    "n_heads": 2,
    "dim_feedforward": 32,
    "n_encoder_layers": 1,
    "n_vae_encoder_layers": 1,
    "latent_dim": 4,
    "chunk_size": 4,
    "n_action_steps": 4,
    "dropout": 0.0,
    "pretrained_backbone_weights": None,
}


def _torchvision_resnet18_state(seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights under torchvision's resnet18 names and shapes, classifier and BN counters included."""
    g = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}

    def conv(name: str, out: int, inp: int, k: int) -> None:
        state[f"{name}.weight"] = torch.randn(out, inp, k, k, generator=g) * (2 / (inp * k * k)) ** 0.5

    def bn(name: str, c: int) -> None:
        state[f"{name}.weight"] = 1 + 0.1 * torch.randn(c, generator=g)
        state[f"{name}.bias"] = 0.1 * torch.randn(c, generator=g)
        state[f"{name}.running_mean"] = 0.1 * torch.randn(c, generator=g)
        state[f"{name}.running_var"] = 1 + 0.1 * torch.rand(c, generator=g)
        state[f"{name}.num_batches_tracked"] = torch.tensor(7)

    conv("conv1", 64, 3, 7)
    bn("bn1", 64)
    inp = 64
    for layer, width in enumerate((64, 128, 256, 512), start=1):
        for block in range(2):
            p = f"layer{layer}.{block}"
            conv(f"{p}.conv1", width, inp, 3)
            bn(f"{p}.bn1", width)
            conv(f"{p}.conv2", width, width, 3)
            bn(f"{p}.bn2", width)
            if block == 0 and layer > 1:
                conv(f"{p}.downsample.0", width, inp, 1)
                bn(f"{p}.downsample.1", width)
            inp = width
    state["fc.weight"], state["fc.bias"] = torch.randn(1000, 512, generator=g), torch.zeros(1000)
    return state


def _reference_trunk(state: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """ResNet-18 up to layer4 written with functional ops only (eval-mode batch norm)."""

    def bn(name: str, y: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(
            y, state[f"{name}.running_mean"], state[f"{name}.running_var"], state[f"{name}.weight"],
            state[f"{name}.bias"], training=False, eps=1e-5,
        )  # fmt: skip

    y = F.relu(bn("bn1", F.conv2d(x, state["conv1.weight"], stride=2, padding=3)))
    y = F.max_pool2d(y, 3, 2, 1)
    for layer in range(1, 5):
        for block in range(2):
            p = f"layer{layer}.{block}"
            stride = 2 if layer > 1 and block == 0 else 1
            out = F.relu(bn(f"{p}.bn1", F.conv2d(y, state[f"{p}.conv1.weight"], stride=stride, padding=1)))
            out = bn(f"{p}.bn2", F.conv2d(out, state[f"{p}.conv2.weight"], padding=1))
            skip = y
            if f"{p}.downsample.0.weight" in state:
                skip = bn(f"{p}.downsample.1", F.conv2d(y, state[f"{p}.downsample.0.weight"], stride=stride))
            y = F.relu(out + skip)
    return y


@pytest.mark.numerics
def test_trunk_with_torchvision_weights_computes_resnet18(tmp_path) -> None:
    state = _torchvision_resnet18_state()
    path = tmp_path / "resnet18.safetensors"
    save_file(state, str(path))
    trunk = ResNetTrunk("resnet18")
    load_pretrained(trunk, str(path))
    x = torch.rand(2, 3, 40, 24)
    with torch.no_grad():
        got, want = trunk(x), _reference_trunk(state, x)
    assert got.shape == (2, 512, 2, 1)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    trunk.train()  # frozen batch norm: training mode changes nothing, and nothing in the trunk's BN trains
    torch.testing.assert_close(trunk(x).detach(), want, rtol=1e-4, atol=1e-4)
    assert not [name for name, _ in trunk.named_parameters() if ".bn" in name or name.startswith("bn")]


def test_trunk_weights_of_another_architecture_or_source_are_one_line_errors(tmp_path, monkeypatch) -> None:
    state = _torchvision_resnet18_state()
    del state["layer3.1.conv2.weight"]
    path = tmp_path / "partial.safetensors"
    save_file(state, str(path))
    with pytest.raises(ConfigError, match=r"pretrained_backbone_weights=.*lack 'layer3.1.conv2.weight'"):
        load_pretrained(ResNetTrunk("resnet18"), str(path))
    state = _torchvision_resnet18_state()
    state["conv1.weight"] = state["conv1.weight"][:, :1].contiguous()  # a grey-scale stem
    save_file(state, str(path))
    with pytest.raises(ConfigError, match=r"'conv1.weight' is \(64, 1, 7, 7\).*another architecture"):
        load_pretrained(ResNetTrunk("resnet18"), str(path))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    for source in ("ResNet18_Weights.IMAGENET1K_V1", "someone/resnet"):
        with pytest.raises(ConfigError) as info:
            load_pretrained(ResNetTrunk("resnet18"), source)
        message = str(info.value)
        assert "\n" not in message and message.startswith(f"--policy.pretrained_backbone_weights={source}:")
        assert "null" in message
    with pytest.raises(ConfigError, match=r"no such file"):
        load_pretrained(ResNetTrunk("resnet18"), str(tmp_path / "missing.safetensors"))


@pytest.fixture
def full_weights(tmp_path):
    path = tmp_path / "full.safetensors"
    save_file(_torchvision_resnet18_state(), str(path))
    return path


def test_resnet34_refuses_resnet18_weights(full_weights) -> None:
    with pytest.raises(ConfigError, match=r"lack 'layer1.2.conv1.weight'"):
        load_pretrained(ResNetTrunk("resnet34"), str(full_weights))


def test_hub_id_is_read_through_the_hf_cache(tmp_path, monkeypatch) -> None:
    from helpers.hf_cache import put_in_hub_cache

    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    state = _torchvision_resnet18_state(seed=3)
    save_file(state, str(snapshot / "model.safetensors"))
    cache = tmp_path / "hub"
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    put_in_hub_cache(snapshot, "timm/resnet18.tv_in1k", "model", str(cache))
    trunk = ResNetTrunk("resnet18")
    load_pretrained(trunk, "ResNet18_Weights.IMAGENET1K_V1")  # LeRobot's default names the same weights
    assert torch.equal(trunk.layer4[1].conv2.weight, state["layer4.1.conv2.weight"])


def test_config_has_lerobots_act_fields_and_defaults() -> None:
    lerobot = json.loads(
        (
            fixture_dir("lerobot", "checkpoint_act") / "checkpoints/000004/pretrained_model/config.json"
        ).read_text()
    )
    ours = ACTConfig()
    architecture = [
        "chunk_size", "n_action_steps", "vision_backbone", "pretrained_backbone_weights",
        "replace_final_stride_with_dilation", "pre_norm", "dim_model", "n_heads", "dim_feedforward",
        "feedforward_activation", "n_encoder_layers", "n_decoder_layers", "use_vae", "latent_dim",
        "n_vae_encoder_layers", "temporal_ensemble_coeff", "dropout", "kl_weight", "optimizer_lr_backbone",
        "n_obs_steps",
    ]  # fmt: skip
    assert all(name in lerobot and hasattr(ours, name) for name in architecture)
    defaults = {name: getattr(ours, name) for name in architecture}
    assert defaults == {
        "chunk_size": 100, "n_action_steps": 100, "vision_backbone": "resnet18",
        "pretrained_backbone_weights": "ResNet18_Weights.IMAGENET1K_V1",
        "replace_final_stride_with_dilation": False, "pre_norm": False, "dim_model": 512, "n_heads": 8,
        "dim_feedforward": 3200, "feedforward_activation": "relu", "n_encoder_layers": 4, "n_decoder_layers": 1,
        "use_vae": True, "latent_dim": 32, "n_vae_encoder_layers": 4, "temporal_ensemble_coeff": None,
        "dropout": 0.1, "kl_weight": 10.0, "optimizer_lr_backbone": 1e-5, "n_obs_steps": 1,
    }  # fmt: skip
    with pytest.raises(
        ConfigError, match=r"--policy.temporal_ensemble_coeff needs --policy.n_action_steps=1"
    ):
        ACTConfig(temporal_ensemble_coeff=0.01)


def _camera_policy(**overrides) -> ACTPolicy:
    torch.manual_seed(0)
    config = ACTConfig(**{**TINY, "input_features": ["observation.state", CAM], "image_shapes": {CAM: [3, 32, 32]}, **overrides})  # fmt: skip
    policy = build_policy(config, 3, 2)
    assert isinstance(policy, ACTPolicy)
    return policy


def _batch(b: int = 3) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {
        "observation.state": torch.randn(b, 3, generator=g),
        CAM: torch.randn(b, 3, 32, 32, generator=g),
        "action": torch.randn(b, 4, 2, generator=g),
        "action_is_pad": torch.tensor([[False] * 4, [False, False, True, True], [False] * 3 + [True]])[:b],
    }


def test_loss_is_masked_l1_plus_weighted_kl() -> None:
    policy = _camera_policy(kl_weight=3.0)
    batch = _batch()
    torch.manual_seed(5)
    loss, metrics = policy(batch)
    torch.manual_seed(5)
    pred, params = policy._predict(batch)  # the same CVAE draw
    assert params is not None
    mu, log_var = params.chunk(2, dim=-1)
    l1 = ((batch["action"] - pred).abs() * (~batch["action_is_pad"])[..., None]).sum() / pred.numel()
    kld = (0.5 * (mu**2 + log_var.exp() - 1 - log_var)).sum(-1).mean()
    torch.testing.assert_close(loss, l1 + 3.0 * kld)
    torch.testing.assert_close(metrics["l1_loss"], l1)
    policy.eval()  # no CVAE at run time: the latent is zero, the loss the L1 alone
    loss, metrics = policy(batch)
    assert "kld_loss" not in metrics and torch.equal(loss, metrics["l1_loss"])


def test_action_queue_runs_the_model_once_per_n_action_steps() -> None:
    policy = _camera_policy(n_action_steps=3).eval()
    batch = _batch()
    chunk = policy.predict_chunk(batch)
    calls = []
    policy.register_forward_pre_hook(lambda *_: calls.append(1))
    original = policy._predict
    policy._predict = lambda b: (calls.append(1), original(b))[1]  # type: ignore[method-assign]
    actions = [policy.select_action(batch) for _ in range(4)]
    assert len(calls) == 2  # steps 0 and 3
    for i in range(3):
        assert torch.equal(actions[i], chunk[:, i])
    assert torch.equal(actions[3], chunk[:, 0])  # same observation, new chunk
    policy.reset()
    assert torch.equal(policy.select_action(batch), chunk[:, 0])


def test_temporal_ensembling_is_the_weighted_mean_of_every_chunk_for_the_step() -> None:
    coeff, chunk_size = 0.3, 4
    ensembler = TemporalEnsembler(coeff, chunk_size)
    chunks = [torch.randn(2, chunk_size, 1, generator=torch.Generator().manual_seed(t)) for t in range(7)]
    for t, chunk in enumerate(chunks):
        got = ensembler.update(chunk)
        # every chunk started at step s <= t that covers t, oldest first with weight exp(-coeff * i)
        preds = [chunks[s][:, t - s] for s in range(max(0, t - chunk_size + 1), t + 1)]
        weights = [math.exp(-coeff * i) for i in range(len(preds))]
        want = sum(w * p for w, p in zip(weights, preds, strict=True)) / sum(weights)
        torch.testing.assert_close(got, want.float())


def test_2d_position_embedding_is_detrs() -> None:
    embed = sinusoidal_2d(3, 5, 8)  # 4 channels for the row, 4 for the column
    assert embed.shape == (8, 3, 5)
    for r, c in ((0, 0), (2, 4), (1, 3)):
        y, x = (r + 1) / (3 + 1e-6) * 2 * math.pi, (c + 1) / (5 + 1e-6) * 2 * math.pi
        freq = [10000 ** (2 * (i // 2) / 4) for i in range(4)]
        want = [
            math.sin(y / freq[0]), math.cos(y / freq[1]), math.sin(y / freq[2]), math.cos(y / freq[3]),
            math.sin(x / freq[0]), math.cos(x / freq[1]), math.sin(x / freq[2]), math.cos(x / freq[3]),
        ]  # fmt: skip
        torch.testing.assert_close(embed[:, r, c], torch.tensor(want), rtol=1e-5, atol=1e-6)


def test_frames_of_another_size_or_a_missing_camera_are_refused() -> None:
    policy = _camera_policy().eval()
    batch = _batch()
    with pytest.raises(ValueError, match=r"camera 'observation.images.top': frames of shape \(3, 24, 32\)"):
        policy.select_action({**batch, CAM: batch[CAM][:, :, :24]})
    with pytest.raises(ValueError, match=r"the batch lacks camera 'observation.images.top'"):
        policy.select_action({k: v for k, v in batch.items() if k != CAM})


def test_backbone_is_its_own_optimizer_group() -> None:
    policy = _camera_policy(optimizer_lr_backbone=1e-4)
    groups = optimizer_params(policy, policy)
    assert isinstance(groups[0], dict) and "lr" not in groups[0] and groups[1]["lr"] == 1e-4
    backbone = {id(p) for p in policy.backbone.parameters()}
    assert {id(p) for p in groups[1]["params"]} == backbone
    assert not backbone & {id(p) for p in groups[0]["params"]}
    state_only = build_policy(ACTConfig(**TINY, input_features=["observation.state"]), 3, 2)
    assert all(isinstance(p, torch.nn.Parameter) for p in optimizer_params(state_only, state_only))


def test_wrap_units_are_layers_and_trunk_stages() -> None:
    from trainer.config.accelerator import FsdpConfig
    from trainer.distributed.wrap import resolve_wrap_plan, unit_roots

    policy = _camera_policy()
    roots = unit_roots(policy, resolve_wrap_plan(policy, FsdpConfig()))
    assert roots == [
        "", "backbone.layer1", "backbone.layer2", "backbone.layer3", "backbone.layer4",
        "encoder.layers.0", "decoder.layers.0", "vae_encoder.layers.0",
    ]  # fmt: skip
    state_only = build_policy(ACTConfig(**TINY, input_features=["observation.state"]), 3, 2)
    assert resolve_wrap_plan(state_only, FsdpConfig()).class_names == ("ACTEncoderLayer", "ACTDecoderLayer")


def test_help_for_act_lists_lerobots_flags(capsys) -> None:
    from trainer.cli import main

    with pytest.raises(SystemExit) as info:
        main(["train", "--policy.type=act", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for flag in (
        "--policy.dim_model=512", "--policy.n_heads=8", "--policy.dim_feedforward=3200",
        "--policy.n_encoder_layers=4", "--policy.chunk_size=100", "--policy.n_action_steps=100",
        "--policy.kl_weight=10.0", "--policy.optimizer_lr_backbone=1e-05",
        "--policy.pretrained_backbone_weights=ResNet18_Weights.IMAGENET1K_V1",
    ):  # fmt: skip
        assert flag in out
    assert "--policy.dim=" not in out and "(act_state)" not in out
