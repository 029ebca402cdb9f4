"""Diffusion Policy through the engine: `--policy.type=diffusion` trained from scratch on LeRobot's camera
dataset (MIN_MAX state and action from its stats.json, the observation history and the action chunk
LeRobot's delta indices ask for, `drop_n_last_frames` honoured by the sampler), saved under LeRobot's
tensor names, resumed bit for bit, fine-tuned from LeRobot's own checkpoint with --policy.path, and
loaded with `trainer.load_policy` to act on raw observations through its queues."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import trainer
from helpers.engine_run import rewound_copy, train_in
from helpers.fixtures import copy_fixture
from helpers.processor_files import same_as_lerobots
from helpers.run_outputs import metrics, model_file, saved_model
from trainer.cli import main
from trainer.data.pipeline.sampler import GlobalOrderSampler, sampled_frames
from trainer.errors import ConfigError
from trainer.evaluation.lerobot_export import export_lerobot

TINY = [
    "--policy.type=diffusion",
    "--policy.pretrained_backbone_weights=null",
    "--policy.use_separate_rgb_encoder_per_camera=false",
    "--policy.horizon=8",
    "--policy.n_action_steps=4",
    "--policy.down_dims=[16,32,64]",
    "--policy.num_inference_steps=10",
    "--policy.optimizer_lr=1e-3",
    "--policy.scheduler_warmup_steps=1",
    "--dataset.root=dataset_video",
    "--batch_size=2",
    "--num_workers=0",
    "--log_freq=1",
]
CAMERAS = ("observation.images.top", "observation.images.wrist")


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The dataset LeRobot's checkpoint was trained on, the checkpoint, and a 4-step run from scratch
    saved at steps 2 and 4."""
    tmp = tmp_path_factory.mktemp("diffusion_engine")
    copy_fixture(tmp, "lerobot", "dataset_video")
    copy_fixture(tmp, "lerobot_diffusion_tiny")
    train_in(tmp, [*TINY, "--steps=4", "--save_freq=2", "--output_dir=straight"])
    return tmp


def test_it_trains_with_a_finite_loss_and_saves_lerobots_names(workdir: Path) -> None:
    records = metrics(workdir / "straight")
    losses = [r["loss"] for r in records if r.get("event") == "train"]
    banner = next(r["banner"] for r in records if r.get("event") == "start")
    assert "--policy.drop_n_last_frames=7: 52 of the 80 frames are drawn as samples" in " ".join(banner)
    assert len(losses) == 4 and all(torch.isfinite(torch.tensor(losses)))
    model = saved_model(workdir / "straight")
    ours = load_file(str(model / "model.safetensors"))
    theirs = load_file(str(workdir / "lerobot_diffusion_tiny" / "pretrained_model" / "model.safetensors"))
    # the same features and sizes but batch norm (the default): LeRobot's names, plus its running stats
    assert all(name.startswith("diffusion.") for name in ours)
    assert {n for n in theirs} <= set(ours) and "diffusion.rgb_encoder.backbone.1.running_mean" in ours
    config = json.loads((model / "config.json").read_text())
    assert config["type"] == "diffusion" and config["input_features"] == ["observation.state", *CAMERAS]
    assert config["image_shapes"] == {name: [3, 24, 40] for name in CAMERAS}


def test_state_and_action_are_normalized_min_max_from_stats_json(workdir: Path) -> None:
    """LeRobot's default for Diffusion Policy: the saved normalizer holds stats.json's min/max for the
    state and action (LeRobot's MIN_MAX onto [-1, 1]), the cameras ImageNet's mean/std."""
    stats = json.loads((workdir / "dataset_video" / "meta" / "stats.json").read_text())
    model = saved_model(workdir / "straight")
    saved = load_file(str(model / "policy_preprocessor_step_3_normalizer_processor.safetensors"))
    for key in ("observation.state", "action"):
        for stat in ("min", "max"):
            assert torch.allclose(saved[f"{key}.{stat}"], torch.tensor(stats[key][stat]), atol=1e-6)
    assert torch.allclose(saved[f"{CAMERAS[0]}.mean"].flatten(), torch.tensor([0.485, 0.456, 0.406]))


def test_a_resumed_run_is_bit_exact(workdir: Path) -> None:
    """Steps 3-4 resumed from step 2, their 2-step observation histories decoded in 2 DataLoader
    workers, give the uninterrupted run's model.safetensors (decoded in the training process) bit for
    bit (the random crop, the noise and the timesteps come from the restored RNG)."""
    checkpoints = rewound_copy(workdir / "straight", workdir / "resumed", 2) / "checkpoints"
    train_in(workdir, ["--resume=true", "--steps=4", "--output_dir=resumed", "--num_workers=2"])
    straight, resumed = (load_file(str(model_file(workdir / run, 4))) for run in ("straight", "resumed"))
    at_two = load_file(str(checkpoints / "000002" / "pretrained_model" / "model.safetensors"))
    assert straight.keys() == resumed.keys()
    assert all(torch.equal(straight[name], resumed[name]) for name in straight)
    assert not all(torch.equal(straight[name], at_two[name]) for name in straight)  # steps 3-4 trained


def test_lerobots_checkpoint_loads_strictly_and_fine_tunes(workdir: Path) -> None:
    """--policy.path=<LeRobot's pretrained_model>: its config.json (LeRobot's schema) and all 213 tensors,
    trained on for 2 steps."""
    base = workdir / "lerobot_diffusion_tiny" / "pretrained_model"
    train_in(workdir, [f"--policy.path={base}", "--dataset.root=dataset_video", "--batch_size=2",
                     "--num_workers=0", "--steps=2", "--output_dir=tuned"])  # fmt: skip
    before = load_file(str(base / "model.safetensors"))
    after = load_file(str(model_file(workdir / "tuned")))
    assert after.keys() == before.keys() and len(after) == 213
    assert not torch.equal(
        after["diffusion.unet.final_conv.1.weight"], before["diffusion.unet.final_conv.1.weight"]
    )
    assert torch.equal(
        after["diffusion.rgb_encoder.pool.pos_grid"], before["diffusion.rgb_encoder.pool.pos_grid"]
    )


def test_the_loaded_checkpoint_acts_on_raw_observations_through_its_queues(workdir: Path) -> None:
    """select_action on one raw observation per call: the model samples a chunk at calls 0 and 4
    (n_action_steps=4), from a history of two copies of the first observation, then of the last two;
    reset() starts over."""
    loaded = trainer.load_policy(str(workdir / "straight" / "checkpoints" / "last"))
    generator = torch.Generator().manual_seed(0)
    frames = [torch.randint(0, 256, (24, 40, 3), generator=generator, dtype=torch.uint8) for _ in range(6)]
    observations = [
        {"observation.state": [0.1 * f, 0.2, 0.0, -0.1], **{name: frames[f].numpy() for name in CAMERAS}}
        for f in range(6)
    ]
    torch.manual_seed(0)
    actions = torch.stack([loaded.select_action(o) for o in observations])
    assert actions.shape == (6, 2) and torch.isfinite(actions).all()

    def history(*indices: int) -> dict[str, torch.Tensor]:
        steps = [loaded.preprocessor(_raw(observations[i])) for i in indices]
        return {key: torch.stack([s[key] for s in steps], dim=1) for key in ("observation.state", *CAMERAS)}

    policy = loaded.policy
    torch.manual_seed(0)
    first = policy.predict_action_chunk(history(0, 0))
    second = policy.predict_action_chunk(history(3, 4))
    expected = loaded.postprocessor({"action": torch.cat([first, second], dim=1)[0]})["action"]
    torch.testing.assert_close(actions, expected[:6], rtol=0, atol=0)
    loaded.reset()
    torch.manual_seed(0)
    assert torch.equal(loaded.select_action(observations[0]), actions[0])


def _raw(observation: dict, features: list[str] | None = None) -> dict[str, torch.Tensor]:
    from trainer.data.pipeline.processors import observation_batch

    return observation_batch(observation, features or ["observation.state", *CAMERAS])[0]


def test_drop_n_last_frames_is_never_sampled() -> None:
    """LeRobot's EpisodeAwareSampler: the last drop_n_last_frames frames of each episode are never
    training samples; every other frame is drawn once per epoch, and the position resumes."""
    bounds = torch.tensor([[0, 20], [20, 40], [40, 45], [45, 65]])
    kept = sampled_frames(bounds, 7)
    assert kept.tolist() == [*range(0, 13), *range(20, 33), *range(45, 58)]  # a 5-frame episode: none
    sampler = GlobalOrderSampler(65, 3, 1, 0, seed=1, kept=kept)
    epoch = torch.cat([sampler.next_indices() for _ in range(13)])
    assert sorted(epoch.tolist()) == kept.tolist()
    assert sampler.next_indices().tolist() != [] and sampler.epoch == 1
    with pytest.raises(ConfigError, match=r"only 0 to sample \(of 65: --policy.drop_n_last_frames\)"):
        GlobalOrderSampler(65, 3, 1, 0, seed=1, kept=sampled_frames(bounds, 20))


def test_a_history_longer_than_every_episode_ends_trainer_train_in_one_line(workdir: Path, capsys) -> None:
    """dataset_video's episodes hold 20 frames: 21 observation steps would pad every sample's history."""
    flags = [*TINY, "--policy.n_obs_steps=21", "--policy.horizon=32", "--output_dir=too_long"]
    with pytest.MonkeyPatch.context() as patch, pytest.raises(SystemExit) as exit_info:
        patch.chdir(workdir)
        main(["train", *flags])
    assert exit_info.value.code == 1 and capsys.readouterr().err.strip().splitlines() == [
        "error: the policy reads 21 observation frames per sample (--policy.n_obs_steps), more than the longest "
        "episode of the dataset holds (20 frames): no sample would see a history of its own; lower "
        "--policy.n_obs_steps to at most 20"
    ]
    assert not (workdir / "too_long").exists()


ENV = "observation.environment_state"


def test_lerobots_config_with_an_environment_state_conditions_on_it_after_the_cameras(workdir: Path) -> None:
    """LeRobot's config.json with an ENV feature: the environment state read at the end of our
    `observation.state` (7 values: the robot's 4, then its 3) and written back as LeRobot's again; each
    observation step conditions the U-Net on [state, camera features, environment state], LeRobot's
    order, so the U-Net's conditioning is 2 x 3 values wider than the checkpoint's."""
    from trainer.policies.diffusion import DiffusionConfig, DiffusionPolicy

    pretrained = workdir / "lerobot_diffusion_tiny" / "pretrained_model"
    saved = json.loads((pretrained / "config.json").read_text())
    saved["input_features"] = {ENV: {"type": "ENV", "shape": [3]}, **saved["input_features"]}
    adapter = DiffusionConfig.lerobot_adapter()
    fields = adapter.config_from_lerobot(saved)
    assert fields.pop("type") == "diffusion"
    config = DiffusionConfig(**fields)
    assert (config.obs_dim, config.env_state_dim) == (7, 3)
    assert config.input_features == ["observation.state", ENV, *CAMERAS]
    assert adapter.config_to_lerobot(config) == saved
    policy = DiffusionPolicy(config).eval()
    film = "diffusion.unet.down_modules.0.0.cond_encoder.1.weight"
    widths = [
        weights[film].shape[1]
        for weights in (policy.state_dict(), load_file(str(pretrained / "model.safetensors")))
    ]
    assert widths[0] == widths[1] + 2 * 3
    generator = torch.Generator().manual_seed(0)
    state = torch.randn(2, 2, 7, generator=generator)
    batch = {
        "observation.state": state,
        **{c: torch.rand(2, 2, 3, 24, 40, generator=generator) for c in CAMERAS},
    }
    steps = policy.diffusion.global_conditioning(policy._cast(batch)).view(2, 2, -1)
    assert torch.equal(steps[..., :4], state[..., :4]) and torch.equal(steps[..., -3:], state[..., 4:])
    cameras = torch.stack([batch[c] for c in CAMERAS], dim=2)
    assert torch.equal(steps[..., 4:-3], policy.diffusion.image_features(cameras))


def test_the_environment_state_trains_unnormalized_and_exports(tmp_path: Path) -> None:
    """LeRobot's dataset_tiny (its own `observation.environment_state`, no camera): the saved normalizer
    holds the robot state's min/max alone (ENV is IDENTITY in LeRobot's mapping), so the model reads the
    environment state as the data gives it, and the export lists both typed features and acts as the
    checkpoint does."""
    copy_fixture(tmp_path, "lerobot", "dataset_tiny")
    flags = [*TINY, "--dataset.root=dataset_tiny", f"--policy.input_features=[observation.state,{ENV}]"]
    train_in(tmp_path, [*flags, "--policy.env_state_dim=3", "--steps=2", "--output_dir=env"])
    checkpoint = tmp_path / "env" / "checkpoints" / "last"
    stats = json.loads((tmp_path / "dataset_tiny" / "meta" / "stats.json").read_text())
    model = checkpoint / "pretrained_model"
    normalizer = load_file(str(model / "policy_preprocessor_step_3_normalizer_processor.safetensors"))
    assert {key for key in normalizer if key.startswith("observation.")} == {
        "observation.state.min",
        "observation.state.max",
    }
    assert torch.allclose(
        normalizer["observation.state.min"], torch.tensor(stats["observation.state"]["min"])
    )
    loaded = trainer.load_policy(str(checkpoint))
    raw = {"observation.state": [0.5, -1.0, 2.0, 0.0], ENV: [3.0, -7.0, 0.25]}
    normalized = loaded.preprocessor(_raw(raw, ["observation.state", ENV]))["observation.state"]
    assert torch.equal(normalized[0, 4:], torch.tensor(raw[ENV]))  # left as it is
    assert not torch.equal(normalized[0, :4], torch.tensor(raw["observation.state"]))  # MIN_MAX
    export = tmp_path / "export"
    export_lerobot(str(checkpoint), str(export))
    written = json.loads((export / "config.json").read_text())["input_features"]
    assert written == {
        "observation.state": {"type": "STATE", "shape": [4]},
        ENV: {"type": "ENV", "shape": [3]},
    }
    actions = []
    for source in (checkpoint, export):
        torch.manual_seed(0)
        actions.append(trainer.load_policy(str(source)).select_action(raw))
    assert torch.equal(actions[0], actions[1])


def test_its_processor_files_are_lerobots(workdir: Path) -> None:
    """lerobot-train's Diffusion Policy on the same dataset wrote the fixture's processor files: ours are
    equal field by field, and their statistics are its numbers (the same stats.json and ImageNet camera
    statistics; the MIN_MAX bounds written back from our centre and half-range)."""
    ours = saved_model(workdir / "straight")
    theirs = workdir / "lerobot_diffusion_tiny" / "pretrained_model"
    same_as_lerobots(ours, theirs)
    for name in (
        "policy_preprocessor_step_3_normalizer_processor.safetensors",
        "policy_postprocessor_step_0_unnormalizer_processor.safetensors",
    ):
        mine, lerobots = load_file(str(ours / name)), load_file(str(theirs / name))
        assert all(torch.allclose(mine[key], lerobots[key], atol=1e-6) for key in mine), name


def test_lerobots_checkpoint_exports_as_it_came(workdir: Path, tmp_path: Path) -> None:
    """LeRobot's checkpoint read by us and exported is LeRobot's again: config.json equal as a whole
    (every field mapped back from ours), every tensor bit for bit, the processor files byte for byte."""
    base = workdir / "lerobot_diffusion_tiny" / "pretrained_model"
    written = export_lerobot(str(base), str(tmp_path / "export"))
    export = tmp_path / "export"
    assert json.loads((export / "config.json").read_text()) == json.loads((base / "config.json").read_text())
    mine, theirs = load_file(str(export / "model.safetensors")), load_file(str(base / "model.safetensors"))
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    processors = sorted(name for name in written if name.startswith("policy_"))
    assert processors == sorted(p.name for p in base.glob("policy_*processor*"))
    assert all((export / name).read_bytes() == (base / name).read_bytes() for name in processors)


def test_an_export_reading_no_single_state_vector_is_one_line() -> None:
    from trainer.policies.diffusion import DiffusionConfig

    config = DiffusionConfig(obs_dim=5, action_dim=2, input_features=["observation.state", "other", *CAMERAS])
    with pytest.raises(ConfigError, match=r"reads the robot state as one observation\.state") as caught:
        DiffusionConfig.lerobot_adapter().config_to_lerobot(config)
    assert "\n" not in str(caught.value)
