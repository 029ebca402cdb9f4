"""Our Diffusion Policy against LeRobot 0.6.1's own outputs (tests/fixtures/lerobot_diffusion_tiny: a
lerobot-train checkpoint, 2 cameras sharing one ResNet18 with group norm, and what LeRobot computed from
it for 3 dataset frames and a 9-call rollout, with the seeds of every random draw).

Tolerances: LeRobot ran in float32 on another CPU, so matmul and convolution kernels may sum in another
order: 1e-5 absolute + 1e-4 relative for everything, single passes and the 100 chained denoising
steps alike (the fixture's README measured up to 5.4e-6 between LeRobot's own 1- and 2-thread runs, on
the first step's x0 estimate, which divides by sqrt(alphas_cumprod[99])). Integer draws must be equal.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

import ckpt_tools
from trainer.data.dataset import IMAGENET_STATS
from trainer.data.pipeline.processors import Processor, build_processors
from trainer.errors import ConfigError
from trainer.policies.common.resnet import ResNetTrunk
from trainer.policies.diffusion import ActionQueue, DiffusionConfig, DiffusionFeatures, DiffusionModel
from trainer.policies.diffusion.vision import center_crop_offsets, random_crop_offsets

FIXTURE = Path(__file__).parents[1] / "fixtures" / "lerobot_diffusion_tiny"
MODEL = FIXTURE / "pretrained_model"
CAMERAS = ("observation.images.top", "observation.images.wrist")
OBSERVATION = ("observation.state", *CAMERAS)
SEEDS = {"loss": 1234, "sample": 5678, "rollout": 42}
ATOL, RTOL = 1e-5, 1e-4


def close(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    assert ours.shape == theirs.shape
    torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=RTOL)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def ref() -> dict[str, torch.Tensor]:
    return load_file(str(FIXTURE / "reference.safetensors"))


@pytest.fixture(scope="module")
def saved() -> dict:
    return json.loads((MODEL / "config.json").read_text())


@pytest.fixture(scope="module")
def model(saved) -> DiffusionModel:
    """LeRobot's checkpoint in our model, held as `diffusion` the way LeRobot's policy holds it."""
    fields = DiffusionConfig.lerobot_adapter().config_from_lerobot(saved)
    assert fields.pop("type") == "diffusion"  # kept for the registry (trainer.load_policy decodes by it)
    config = DiffusionConfig(**fields)
    built = DiffusionModel(config, DiffusionFeatures.from_lerobot(saved))
    nn.ModuleDict({"diffusion": built}).load_state_dict(
        load_file(str(MODEL / "model.safetensors")), strict=True
    )
    return built.eval()


@pytest.fixture(scope="module")
def processors() -> tuple[Processor, Processor]:
    saved = ckpt_tools.load_processors(str(MODEL))
    pre, post = (saved[name] for name in ("policy_preprocessor", "policy_postprocessor"))
    return Processor.from_state(pre.config, pre.step_tensors), Processor.from_state(
        post.config, post.step_tensors
    )


def pre_batch(ref: dict[str, torch.Tensor], actions: bool = True) -> dict[str, torch.Tensor]:
    keys = [*OBSERVATION, *(("action", "action_is_pad") if actions else ())]
    return {key: ref[f"pre.{key}"] for key in keys}


def test_the_checkpoint_loads_strictly_and_is_read_from_lerobots_config(model, saved) -> None:
    theirs = load_file(str(MODEL / "model.safetensors"))
    ours = nn.ModuleDict({"diffusion": model}).state_dict()
    assert len(theirs) == 213 and set(ours) == set(theirs)
    assert all(torch.equal(ours[name], tensor) for name, tensor in theirs.items())
    assert sum(p.numel() for p in model.parameters()) == 11_922_226  # LeRobot's logged num_total_params
    config = model.config
    assert (config.horizon, config.n_obs_steps, config.n_action_steps, config.crop_shape) == (
        8,
        2,
        4,
        (43, 72),
    )
    assert model.cameras == list(CAMERAS) and model.features.state_dim == 4 and model.features.action_dim == 2


def test_the_rng_protocol_reproduces_every_stored_draw(ref) -> None:
    torch.manual_seed(SEEDS["sample"])
    assert torch.equal(torch.randn((3, 8, 2)), ref["inference.x_T"])
    assert torch.equal(
        torch.stack([torch.randn((3, 8, 2)) for _ in range(99)]), ref["inference.steps.variance_noise"]
    )
    torch.manual_seed(SEEDS["loss"])
    assert torch.equal(torch.randn((3, 8, 2)), ref["loss.eps"])
    assert torch.equal(torch.randint(0, 100, (3,)), ref["loss.timesteps"])
    torch.manual_seed(SEEDS["loss"])
    assert torch.tensor([random_crop_offsets(torch.Size((48, 80)), (43, 72))]).equal(
        ref["loss_train.crop_offsets"]
    )
    assert torch.equal(torch.randn((3, 8, 2)), ref["loss_train.eps"])
    assert torch.equal(torch.randint(0, 100, (3,)), ref["loss_train.timesteps"])
    torch.manual_seed(SEEDS["rollout"])
    for chunk in range(3):  # one stream through the rollout's three chunks
        assert torch.equal(torch.randn((1, 8, 2)), ref[f"rollout.chunk{chunk}.x_T"])
        noises = torch.stack([torch.randn((1, 8, 2)) for _ in range(99)])
        assert torch.equal(noises, ref[f"rollout.chunk{chunk}.variance_noise"])


def test_the_preprocessor_and_postprocessor_are_lerobots(ref, processors) -> None:
    """MEAN_STD cameras with ImageNet's statistics, MIN_MAX state and action onto [-1, 1]."""
    pre, post = processors
    raw = {key: ref[f"raw.{key}"] for key in (*OBSERVATION, "action")}
    out = pre(raw)
    for key in (*OBSERVATION, "action"):
        close(out[key], ref[f"pre.{key}"])
    close(post({"action": ref["actions.normalized"]})["action"], ref["actions.unnormalized"])


def test_dataset_statistics_normalize_as_lerobots_processor(ref) -> None:
    """The engine's processors, built from a dataset's statistics through the config's
    normalization_stats (MIN_MAX min/max as centre and half-range, the cameras' ImageNet mean/std),
    preprocess as LeRobot's saved processor did; an unmapped type (ENV) stays as it is."""
    state = load_file(str(MODEL / "policy_preprocessor_step_3_normalizer_processor.safetensors"))
    stats = {
        key: {stat: state[f"{key}.{stat}"] for stat in ("mean", "std", "min", "max")}
        for key in ("observation.state", "action")
    }
    stats.update({name: {"mean": IMAGENET_STATS["mean"], "std": IMAGENET_STATS["std"]} for name in CAMERAS})
    stats["observation.environment_state"] = {"mean": torch.full((3,), 5.0), "std": torch.full((3,), 2.0)}
    config = DiffusionConfig(pretrained_backbone_weights=None)
    normalized = config.normalization_stats(stats)
    assert torch.equal(normalized["observation.environment_state"]["std"], torch.ones(3))
    pre, _ = build_processors(normalized)
    out = pre({key: ref[f"raw.{key}"] for key in (*OBSERVATION, "action")})
    for key in (*OBSERVATION, "action"):
        close(out[key], ref[f"pre.{key}"])
    del stats["action"]["min"]
    with pytest.raises(ConfigError, match="maps action to MIN_MAX, but the dataset gives no min/max"):
        config.normalization_stats(stats)


def test_the_image_path_matches_lerobot(model, ref) -> None:
    """Frames in (b s n) order, resized (antialiased bilinear) and centre-cropped, the trunk, the
    keypoints, the projected features, the global conditioning."""
    frames = torch.stack([ref[f"pre.{name}"] for name in CAMERAS], dim=2).flatten(0, 2)
    assert torch.equal(frames, ref["inference.image_in"])
    assert center_crop_offsets(torch.Size((48, 80)), (43, 72)) == (2, 4)  # round(2.5) is 2
    encoder = model.rgb_encoder
    with torch.no_grad():
        close(encoder.prepare(frames), ref["inference.backbone_in"])
        close(encoder.backbone(ref["inference.backbone_in"]), ref["inference.feature_map"])
        close(encoder.pool(ref["inference.feature_map"]), ref["inference.keypoints"])
        close(encoder(frames), ref["inference.image_features"])
        close(model.global_conditioning(pre_batch(ref, actions=False)), ref["inference.global_cond"])


def test_the_unet_alone_at_t37(model, ref) -> None:
    t = ref["unet.fixed_t.timestep"]
    steps = model.unet.diffusion_step_encoder
    with torch.no_grad():
        close(steps[0](t), ref["unet.fixed_t.sinusoidal_embedding"])
        close(steps(t), ref["unet.fixed_t.timestep_embedding"])
        close(model.unet(ref["inference.x_T"], t, ref["inference.global_cond"]), ref["unet.fixed_t.out"])


def test_the_noise_schedule_is_lerobots(model, ref) -> None:
    scheduler = model.noise_scheduler
    assert torch.equal(scheduler.betas, ref["scheduler.betas"])
    assert torch.equal(scheduler.alphas_cumprod, ref["scheduler.alphas_cumprod"])
    scheduler.set_timesteps(model.num_inference_steps)
    assert torch.equal(scheduler.timesteps, ref["scheduler.inference_timesteps"])


def test_every_denoising_step_matches_lerobot(model, ref) -> None:
    """Step by step from LeRobot's own x_t, so a mismatch names its step."""
    scheduler, cond = model.noise_scheduler, ref["inference.global_cond"]
    scheduler.set_timesteps(model.num_inference_steps)
    torch.manual_seed(SEEDS["sample"])
    torch.randn((3, 8, 2))  # x_T: the draws of the steps follow it
    for i, t in enumerate(scheduler.timesteps):
        sample = ref["inference.steps.sample_in"][i]
        with torch.no_grad():
            out = model.unet(sample, torch.full((3,), int(t)), cond)
        close(out, ref["inference.steps.model_output"][i])
        step = scheduler.step(out, t, sample)
        close(step.pred_original_sample, ref["inference.steps.pred_original_sample"][i])
        close(step.prev_sample, ref["inference.steps.prev_sample"][i])


def test_the_sampled_chunk_matches_lerobot(model, ref, processors) -> None:
    torch.manual_seed(SEEDS["sample"])
    with torch.no_grad():
        chunk = model.sample_chunk(model.global_conditioning(pre_batch(ref, actions=False)))
    close(chunk, ref["actions.horizon"])
    torch.manual_seed(SEEDS["sample"])
    actions = model.sample_actions(pre_batch(ref, actions=False))
    close(actions, ref["actions.normalized"])
    assert actions.abs().max() <= 1  # the last step returns the clipped x0
    close(processors[1]({"action": actions})["action"], ref["actions.unnormalized"])


def test_the_eval_mode_loss_matches_lerobot(model, ref, monkeypatch) -> None:
    batch = pre_batch(ref)
    with torch.no_grad():
        torch.manual_seed(SEEDS["loss"])
        close(model.compute_loss(batch, reduction="none"), ref["loss.elementwise"])
        torch.manual_seed(SEEDS["loss"])
        close(model.compute_loss(batch), ref["loss.mean"])
        noisy = model.noise_scheduler.add_noise(ref["pre.action"], ref["loss.eps"], ref["loss.timesteps"])
        close(noisy, ref["loss.noisy_trajectory"])
        close(model.unet(noisy, ref["loss.timesteps"], ref["inference.global_cond"]), ref["loss.pred"])
        monkeypatch.setattr(model.config, "do_mask_loss_for_padding", True)
        torch.manual_seed(SEEDS["loss"])
        close(model.compute_loss(batch), ref["loss.mean_other_masking"])


def test_the_train_mode_loss_matches_lerobot(model, ref) -> None:
    """One random crop for the whole shared-encoder call, drawn before the noise and the timesteps."""
    batch = pre_batch(ref)
    model.train()
    try:
        with torch.no_grad():
            torch.manual_seed(SEEDS["loss"])
            close(model.rgb_encoder.prepare(ref["inference.image_in"]), ref["loss_train.backbone_in"])
            torch.manual_seed(SEEDS["loss"])
            close(model.global_conditioning(batch), ref["loss_train.global_cond"])
            torch.manual_seed(SEEDS["loss"])
            loss = model.compute_loss(batch)
            close(loss, ref["loss_train.mean"])
            pred = model.unet(
                model.noise_scheduler.add_noise(
                    ref["pre.action"], ref["loss_train.eps"], ref["loss_train.timesteps"]
                ),
                ref["loss_train.timesteps"],
                ref["loss_train.global_cond"],
            )
        close(pred, ref["loss_train.pred"])
    finally:
        model.eval()


def test_the_rollout_matches_lerobot(model, ref, processors, monkeypatch) -> None:
    """9 select_action calls on raw single observations: preprocessed, queued, a chunk at calls 0, 4, 8
    (each chunk's conditioning and denoised horizon checked on its own, to name a mismatch)."""
    pre, post = processors
    chunks: list[tuple[torch.Tensor, torch.Tensor]] = []
    sample_chunk = model.sample_chunk

    def recorded(cond: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
        chunks.append((cond, sample_chunk(cond, noise)))
        return chunks[-1][1]

    monkeypatch.setattr(model, "sample_chunk", recorded)
    queue = ActionQueue(model)
    torch.manual_seed(SEEDS["rollout"])
    actions, chunk_calls = [], []
    for f in range(9):
        observation = pre({key: ref[f"rollout.raw.{key}"][f] for key in OBSERVATION})
        observation = {key: value.unsqueeze(0) for key, value in observation.items()}  # LeRobot's to_batch
        for key in OBSERVATION:
            close(observation[key], ref[f"rollout.pre.{key}"][f])
        if not queue.actions:
            chunk_calls.append(f)
        actions.append(queue.select_action(observation))
    assert chunk_calls == ref["rollout.chunk_calls"].tolist()
    for index, (cond, chunk) in enumerate(chunks):
        close(cond, ref[f"rollout.chunk{index}.global_cond"])
        close(chunk, ref[f"rollout.chunk{index}.actions_horizon"])
    close(torch.stack(actions), ref["rollout.actions.normalized"])
    close(post({"action": torch.stack(actions)})["action"], ref["rollout.actions.unnormalized"])


def test_separate_encoders_give_the_shared_ones_features_and_crop_per_camera(model, saved, ref) -> None:
    """Two encoders holding the shared one's weights condition as it does (the per-camera arrangement),
    and in training each camera draws its own crop, in camera order."""
    config = dataclasses.replace(model.config, use_separate_rgb_encoder_per_camera=True)
    separate = DiffusionModel(config, model.features).eval()
    shared = model.rgb_encoder.state_dict()
    for encoder in separate.rgb_encoder.children():
        encoder.load_state_dict(shared)
    batch = pre_batch(ref, actions=False)
    with torch.no_grad():
        close(separate.global_conditioning(batch), ref["inference.global_cond"])
        separate.train()
        torch.manual_seed(SEEDS["loss"])
        separate.global_conditioning(batch)
        after = torch.randn(1)
    torch.manual_seed(SEEDS["loss"])
    for _ in CAMERAS:  # (top, left) for each camera: 48 - 43 + 1 and 80 - 72 + 1 positions
        torch.randint(0, 6, (1,)), torch.randint(0, 9, (1,))
    assert torch.equal(after, torch.randn(1))


def test_lerobots_default_sizes_and_batch_norm_names(saved) -> None:
    """LeRobot's DiffusionConfig() defaults (batch norm, one encoder per camera, down_dims 512/1024/2048,
    horizon 64), built on the meta device: the parameter and tensor counts the fixture's tensors.txt
    gives, measured with LeRobot's own DiffusionPolicy; batch norm keeps its running statistics."""
    pusht = DiffusionFeatures(state_dim=2, action_dim=2, cameras={"observation.images.top": (3, 96, 96)})
    config = DiffusionConfig(pretrained_backbone_weights=None)
    for features, params, tensors in (
        (pusht, 262_709_026, 273),
        (DiffusionFeatures.from_lerobot(saved), 277_690_818, 398),
    ):
        with torch.device("meta"):
            built = DiffusionModel(config, features)
        assert sum(p.numel() for p in built.parameters()) == params
        assert len(built.state_dict()) == tensors
        assert built.noise_scheduler.alphas_cumprod.device.type == "cpu"  # not module state: never meta
    names = set(built.state_dict())
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        assert (
            f"rgb_encoder.1.backbone.4.0.bn1.{name}" in names and f"rgb_encoder.0.backbone.1.{name}" in names
        )


def test_pretrained_backbone_weights_load_into_every_camera_trunk(tmp_path) -> None:
    """torchvision-named ResNet18 weights (a local file here; a Hub id goes through the cache) land in
    each camera's Sequential-named trunk, batch-norm statistics included."""
    source = ResNetTrunk("resnet18", norm=nn.BatchNorm2d)
    generator = torch.Generator().manual_seed(0)
    state = {
        name: torch.rand(t.shape, generator=generator)
        for name, t in source.state_dict().items()
        if not name.endswith("num_batches_tracked")
    }
    save_file(state, str(tmp_path / "resnet18.safetensors"))
    config = DiffusionConfig(
        pretrained_backbone_weights=str(tmp_path / "resnet18.safetensors"), horizon=16, n_action_steps=8
    )
    cameras = {name: (3, 24, 40) for name in CAMERAS}
    model = DiffusionModel(config, DiffusionFeatures(state_dim=4, action_dim=2, cameras=cameras))
    model.load_pretrained_backbone()
    for encoder in model.rgb_encoder.children():
        ours = encoder.backbone.state_dict()
        assert torch.equal(ours["4.0.conv1.weight"], state["layer1.0.conv1.weight"])
        assert torch.equal(ours["7.0.downsample.1.running_var"], state["layer4.0.downsample.1.running_var"])
        assert torch.equal(ours["1.running_mean"], state["bn1.running_mean"])


def test_ddim_draws_nothing_after_the_initial_sample(model) -> None:
    config = dataclasses.replace(model.config, noise_scheduler_type="DDIM", num_inference_steps=10)
    ddim = DiffusionModel(config, model.features).eval()
    ddim.load_state_dict(model.state_dict())
    cond = torch.zeros(2, 264)
    torch.manual_seed(0)
    ddim.sample_chunk(cond)
    after = torch.randn(1)
    torch.manual_seed(0)
    torch.randn((2, 8, 2))
    assert torch.equal(after, torch.randn(1))
    assert ddim.noise_scheduler.timesteps.tolist() == list(range(90, -1, -10))


def test_sample_prediction_targets_the_actions(model, ref) -> None:
    config = dataclasses.replace(model.config, prediction_type="sample")
    sample = DiffusionModel(config, model.features).eval()
    sample.load_state_dict(model.state_dict())
    torch.manual_seed(SEEDS["loss"])
    with torch.no_grad():
        elementwise = sample.compute_loss(pre_batch(ref), reduction="none")
    close(elementwise, (ref["loss.pred"] - ref["pre.action"]) ** 2)


BAD_CONFIGS = [
    ({"horizon": 12}, "--policy.horizon=12"),
    ({"n_action_steps": 64}, "--policy.n_action_steps=64"),
    ({"noise_scheduler_type": "PNDM"}, "--policy.noise_scheduler_type='PNDM'"),
    ({"prediction_type": "v_prediction"}, "--policy.prediction_type='v_prediction'"),
    ({"vision_backbone": "resnet50"}, "--policy.vision_backbone='resnet50'"),
    ({"use_group_norm": True}, "--policy.use_group_norm=true"),
    ({"resize_shape": (48, 80), "crop_shape": (40, 70), "crop_ratio": 0.9}, "--policy.crop_shape=[40, 70]"),
    ({"crop_ratio": 1.5}, "--policy.crop_ratio=1.5"),
    ({"resize_shape": (48,)}, "--policy.resize_shape=[48]"),
    ({"kernel_size": 4}, "--policy.kernel_size=4"),
    ({"num_inference_steps": 200}, "--policy.num_inference_steps=200"),
    ({"compile_model": True}, "--policy.compile_model=true"),
    (
        {"env_state_dim": 3, "input_features": ["observation.environment_state", "observation.state"]},
        "--policy.env_state_dim=3",
    ),
    ({"env_state_dim": 3, "obs_dim": 3}, "--policy.env_state_dim=3"),
]


@pytest.mark.parametrize(("fields", "flag"), BAD_CONFIGS, ids=[flag for _, flag in BAD_CONFIGS])
def test_a_bad_config_is_one_line_naming_the_flag(fields, flag) -> None:
    with pytest.raises(ConfigError) as caught:
        DiffusionConfig(**fields)
    assert str(caught.value).startswith(flag) and "\n" not in str(caught.value)


def test_a_crop_larger_than_the_frames_is_refused() -> None:
    features = DiffusionFeatures(state_dim=4, action_dim=2, cameras={"observation.images.top": (3, 24, 40)})
    config = DiffusionConfig(crop_shape=(30, 30), pretrained_backbone_weights=None)
    with pytest.raises(ConfigError, match=r"^--policy.crop_shape=\[30, 30\] is larger than the 24x40 frames"):
        config.check_features(features)
    config = DiffusionConfig(resize_shape=(48, 80), crop_ratio=0.9, pretrained_backbone_weights=None)
    config.check_features(features)  # the crop is taken from the resized 48x80 frames
