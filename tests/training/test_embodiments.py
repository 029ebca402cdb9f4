"""A mixture whose members differ (data/pipeline/embodiments.py), on two LeRobot-written robots:
`dataset_video` (state 4, action 2, two video cameras, 10 fps) and `dataset_arm6` (state 6, action 3,
one image camera, 15 fps). Each item is its member's own sample, padded, at its member's fps, and
normalized by its member's own statistics; SmolVLA (`PolicyConfig.takes_mixed_members`) trains on it,
its checkpoint keeps every robot's statistics, and `load_policy(embodiment=)`, `trainer export
--embodiment` and `trainer eval --embodiment` give the policy of one robot, acting on that robot's raw
observations. Diffusion Policy takes robots that differ in fps only; the others are refused in one line
naming the member and the feature. (The 2-rank FSDP2 run, its exact resume and the padded dims'
gradients under FSDP2: tests/distributed/test_embodiments_sharded.py.)"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import ckpt_tools
import trainer
from helpers.engine_run import TINY_SMOLVLA, train_in
from helpers.fixtures import copy_fixture, fixture_dir
from helpers.lerobot_data import write_dataset
from helpers.processor_files import same_as_lerobots
from helpers.run_outputs import saved_model
from trainer.cli.eval_command import run_eval
from trainer.cli.export_command import run as export_command
from trainer.cli.parse import parse_config
from trainer.config.dataset import Frames
from trainer.data.dataset import (
    ACTION_DIM_PAD_KEY,
    ALL_CAMERAS,
    EMBODIMENT_KEY,
    OBS_KEY,
    STATE_DIM_PAD_KEY,
    TASK_KEY,
)
from trainer.data.pipeline.embodiments import MixedMixture
from trainer.data.pipeline.processors import Processor, embodied_processors
from trainer.data.sources.mixture import MixtureConfig
from trainer.errors import ConfigError
from trainer.policies import build_policy
from trainer.policies.common.base import fit_to_data

TOP, WRIST, FRONT = (f"observation.images.{name}" for name in ("top", "wrist", "front"))
SMOLVLA = TINY_SMOLVLA
VIDEO, ARM6 = "dataset_video", "dataset_arm6"
VIDEO_FRAMES = 80  # dataset_video's frames come first in the mixture's index space
LEROBOT_SMOLVLA = fixture_dir("lerobot_smolvla_tiny", "pretrained_model")  # lerobot-train on dataset_video


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The two LeRobot-written robots, the mixture file naming both, the backbone."""
    tmp = tmp_path_factory.mktemp("embodiments")
    copy_fixture(tmp, "lerobot", VIDEO)
    copy_fixture(tmp, "lerobot", ARM6)
    shutil.copytree(copy_fixture(tmp, "lerobot_smolvla_tiny") / "tiny_smolvlm", tmp / "tiny_smolvlm")
    (tmp / "mixture.json").write_text(json.dumps([{"root": VIDEO}, {"root": ARM6}]))
    return tmp


def _mixture(workdir: Path, file: str = "mixture.json", *flags: str) -> MixedMixture:
    config = parse_config([f"--dataset.mixture={workdir / file}", *flags]).dataset
    assert isinstance(config, MixtureConfig)
    data = config.serving(True).load([OBS_KEY, ALL_CAMERAS, TASK_KEY])
    assert isinstance(data, MixedMixture)
    return data


def _arm6(episode: int, frames: range, what: str) -> torch.Tensor:
    """dataset_arm6's values, as make_dataset_arm6.py wrote them (formulas of episode and frame)."""
    f = np.asarray(frames, dtype=np.float64)[:, None]
    if what == "state":
        values = episode + f / 16 + np.arange(6) / 64
    else:
        values = -(episode + f / 16) + np.arange(3) / 8
    return torch.from_numpy(values.astype(np.float32))


def _stats(workdir: Path, dataset: str, key: str) -> tuple[torch.Tensor, torch.Tensor]:
    stats = json.loads((workdir / dataset / "meta" / "stats.json").read_text())[key]
    return torch.tensor(stats["mean"], dtype=torch.float32), torch.tensor(stats["std"], dtype=torch.float32)


def test_each_item_is_its_members_own_sample_padded_with_masks(workdir: Path) -> None:
    data = _mixture(workdir)
    assert (data.obs_dim, data.action_dim) == (6, 3)
    assert data.input_features == [OBS_KEY, TOP, WRIST, TASK_KEY, FRONT]
    assert [(e.name, e.obs_dim, e.action_dim, e.input_features) for e in data.embodiments] == [
        (VIDEO, 4, 2, (OBS_KEY, TOP, WRIST, TASK_KEY)),
        (ARM6, 6, 3, (OBS_KEY, FRONT, TASK_KEY)),
    ]
    chunk = Frames.chunk(5)
    batch = data.gather(torch.tensor([3, VIDEO_FRAMES + 4]), chunk)
    video, arm = (m.gather(torch.tensor([i]), chunk) for m, i in zip(data.members, (3, 4), strict=True))
    assert torch.equal(batch[OBS_KEY][0, :4], video[OBS_KEY][0]) and not batch[OBS_KEY][0, 4:].any()
    assert torch.equal(batch["action"][0, :, :2], video["action"][0]) and not batch["action"][0, :, 2].any()
    assert torch.equal(batch[OBS_KEY][1], _arm6(0, range(4, 5), "state")[0])
    assert torch.equal(batch["action"][1], arm["action"][0])
    assert batch[EMBODIMENT_KEY].tolist() == [0, 1]
    assert batch[STATE_DIM_PAD_KEY].tolist() == [[False] * 4 + [True] * 2, [False] * 6]
    assert batch[ACTION_DIM_PAD_KEY].tolist() == [[False, False, True], [False] * 3]
    # a camera the item's member lacks is an empty, masked slot
    assert batch[f"{FRONT}_padding_mask"].tolist() == [False, True]
    assert batch[f"{TOP}_padding_mask"].tolist() == [True, False] and not batch[TOP][1].any()
    assert torch.equal(batch[FRONT][1], arm[FRONT][0]) and not batch[FRONT][0].any()


def test_augmentation_transforms_the_frames_and_leaves_the_camera_masks(workdir: Path) -> None:
    """--dataset.image_transforms.enable=true on a mixture of robots: the masks named after a camera
    (`<camera>_padding_mask`) are not frames (they once reached kornia and failed)."""
    config = parse_config(
        [f"--dataset.mixture={workdir / 'mixture.json'}", "--dataset.image_transforms.enable=true"]
    ).dataset
    data = config.serving(True).load([OBS_KEY, ALL_CAMERAS, TASK_KEY])
    augment = config.augmentation(0, 0)
    assert augment is not None
    batch = data.gather(torch.tensor([3, VIDEO_FRAMES + 4]), Frames.chunk(5))
    out = augment(batch, 1)
    for camera in (TOP, WRIST, FRONT):
        assert out[camera].dtype == torch.float32 and out[camera].shape == batch[camera].shape
        assert torch.equal(out[f"{camera}_padding_mask"], batch[f"{camera}_padding_mask"])


def test_each_member_keeps_its_own_fps(workdir: Path) -> None:
    """The 15 fps robot's chunk is its next 5 frames as LeRobot wrote them (a third of a second of it),
    beside the 10 fps robot's (half a second): the offsets count each member's own frames."""
    batch = _mixture(workdir).gather(torch.tensor([VIDEO_FRAMES + 2]), Frames.chunk(5))
    assert torch.equal(batch["action"][0], _arm6(0, range(2, 7), "action"))
    assert json.loads((workdir / ARM6 / "meta" / "info.json").read_text())["fps"] == 15


def test_each_item_is_normalized_by_its_own_robots_statistics(workdir: Path) -> None:
    """Not pooled: the 4-state robot's values by its stats.json, the 6-state robot's by its own; padded
    values stay 0. The processors' saved state reads back to the same normalization, bit for bit."""
    data = _mixture(workdir)
    pre, _ = embodied_processors(data.embodiment_stats(), None, data.embodiments)
    raw = data.gather(torch.tensor([3, VIDEO_FRAMES + 4]), Frames.chunk(5))
    out = pre(raw)
    for item, dataset, width in ((0, VIDEO, 4), (1, ARM6, 6)):
        mean, std = _stats(workdir, dataset, OBS_KEY)
        torch.testing.assert_close(out[OBS_KEY][item, :width], (raw[OBS_KEY][item, :width] - mean) / std)
        mean, std = _stats(workdir, dataset, "action")
        torch.testing.assert_close(
            out["action"][item, :, : len(mean)], (raw["action"][item, :, : len(mean)] - mean) / std
        )
    assert not out[OBS_KEY][0, 4:].any() and not out["action"][0, :, 2:].any()
    read = Processor.from_state(*pre.state())
    assert read.embodiments == data.embodiments
    again = read(raw)
    assert all(torch.equal(again[key], out[key]) for key in (OBS_KEY, "action"))


def test_padded_action_dims_get_exactly_zero_gradient(workdir: Path, monkeypatch) -> None:
    """The smaller robot's padded action dim gives its rows of the action output projection exactly zero
    gradient; the robot with that dim gives them a real one."""
    monkeypatch.chdir(workdir)
    data = _mixture(workdir)
    config = parse_config([*SMOLVLA, f"--dataset.mixture={workdir / 'mixture.json'}"]).policy
    torch.manual_seed(0)
    policy = build_policy(fit_to_data(config, data), data.obs_dim, data.action_dim)
    pre, _ = embodied_processors(data.embodiment_stats(), None, data.embodiments)
    out = policy.model.action_out_proj

    def grads(indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        policy.zero_grad()
        loss, _ = policy(pre(data.gather(torch.tensor(indices), policy.config.frames)))
        loss.backward()
        return out.weight.grad.clone(), out.bias.grad.clone()

    weight, bias = grads([0, 10])  # the video robot: 2 action dims of 3
    assert not weight[2:].any() and not bias[2:].any()
    assert weight[:2].abs().sum() > 0
    weight, bias = grads([VIDEO_FRAMES, VIDEO_FRAMES + 5])  # the 3-dim robot
    assert weight[2].abs().sum() > 0 and not weight[3:].any()


@pytest.fixture(scope="module")
def trained(workdir: Path) -> Path:
    """2 steps of a tiny SmolVLA on the two robots; its final step's pretrained_model/."""
    train_in(workdir, [*SMOLVLA, "--dataset.mixture=mixture.json", "--steps=2", "--output_dir=trained"])
    return saved_model(workdir / "trained")


def test_the_checkpoint_keeps_each_robots_statistics(workdir: Path, trained: Path) -> None:
    """The first robot's (the default embodiment's) under LeRobot's names, widened to the policy's sizes,
    the second's beside them under `embodiment.1.`, and the list of robots in the processor config."""
    config = json.loads((trained / "config.json").read_text())
    assert config["input_features"][OBS_KEY]["shape"] == [6] and config["output_features"]["action"][
        "shape"
    ] == [3]
    preprocessor = json.loads((trained / "policy_preprocessor.json").read_text())
    assert [(e["name"], e["obs_dim"], e["action_dim"]) for e in preprocessor["embodiments"]] == [
        (VIDEO, 4, 2),
        (ARM6, 6, 3),
    ]
    state = load_file(str(trained / preprocessor["steps"][-1]["state_file"]))
    mean, std = _stats(workdir, VIDEO, OBS_KEY)
    assert torch.equal(state["observation.state.mean"], torch.cat([mean, torch.zeros(2)]))
    assert torch.equal(state["observation.state.std"], torch.cat([std, torch.ones(2)]))
    mean, std = _stats(workdir, ARM6, "action")
    assert torch.equal(state["embodiment.1.action.mean"], mean)
    assert torch.equal(state["embodiment.1.action.std"], std)


def _raw(embodiment: str, batch: int = 2) -> dict[str, object]:
    """A raw observation of one robot, as it gives one: its state, its cameras (uint8 H x W x 3)."""
    g = torch.Generator().manual_seed(1)
    shapes = {VIDEO: {TOP: (batch, 24, 40, 3), WRIST: (batch, 24, 40, 3)}, ARM6: {FRONT: (batch, 16, 16, 3)}}
    cameras = {
        name: torch.randint(0, 256, s, generator=g, dtype=torch.uint8).numpy()
        for name, s in shapes[embodiment].items()
    }
    state = torch.randn(batch, 4 if embodiment == VIDEO else 6, generator=g)
    return {OBS_KEY: state, TASK_KEY: ["pick"] * batch, **cameras}


def _actions(policy: trainer.LoadedPolicy, observation: dict[str, object]) -> torch.Tensor:
    policy.reset()
    torch.manual_seed(0)  # the flow-matching noise
    return policy.select_action(observation)


@pytest.fixture(scope="module")
def exports(workdir: Path, trained: Path) -> dict[str, Path]:
    """`trainer export --embodiment=NAME` of the trained checkpoint, for each robot."""
    out = {name: workdir / f"export_{name}" for name in (VIDEO, ARM6)}
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(workdir)  # where the config's backbone name resolves
        for name, export in out.items():
            export_command([f"--policy.path={trained}", f"--output_dir={export}", f"--embodiment={name}"])
    return out


def test_each_robots_policy_acts_on_its_raw_observations_as_its_export_does(
    workdir: Path, trained: Path, exports: dict[str, Path], monkeypatch
) -> None:
    monkeypatch.chdir(workdir)
    for name, features, actions in (
        (VIDEO, [OBS_KEY, TOP, WRIST, TASK_KEY], 2),
        (ARM6, [OBS_KEY, FRONT, TASK_KEY], 3),
    ):
        loaded = trainer.load_policy(str(trained), embodiment=name)
        assert loaded.embodiment is not None and loaded.embodiment.name == name
        assert loaded.input_features == features
        acted = _actions(loaded, _raw(name))
        assert acted.shape == (2, actions) and acted.isfinite().all()
        assert torch.equal(_actions(trainer.load_policy(str(exports[name])), _raw(name)), acted)
    default = trainer.load_policy(str(trained)).embodiment
    assert default is not None and default.name == VIDEO  # the default: the first member


def test_each_robots_export_is_what_lerobot_writes_for_that_robot(
    workdir: Path, exports: dict[str, Path]
) -> None:
    """The video robot's export: processor files as lerobot-train wrote them for a SmolVLA on that robot
    alone (tests/fixtures/lerobot_smolvla_tiny), holding the same statistics, and its config.json's
    features; the other robot's: its own sizes, camera and statistics."""
    video, arm6 = exports[VIDEO], exports[ARM6]
    same_as_lerobots(video, LEROBOT_SMOLVLA, backbone=workdir / "tiny_smolvlm")
    step = "policy_preprocessor_step_5_normalizer_processor.safetensors"
    ours, lerobots = load_file(str(video / step)), load_file(str(LEROBOT_SMOLVLA / step))
    assert sorted(ours) == ["action.mean", "action.std", "observation.state.mean", "observation.state.std"]
    assert all(torch.equal(ours[k], lerobots[k]) for k in ours)  # the robot's own, not pooled
    config, theirs = (json.loads((d / "config.json").read_text()) for d in (video, LEROBOT_SMOLVLA))
    assert config["input_features"] == theirs["input_features"]
    assert config["output_features"] == theirs["output_features"]
    config = json.loads((arm6 / "config.json").read_text())
    assert config["input_features"] == {
        OBS_KEY: {"type": "STATE", "shape": [6]},
        FRONT: {"type": "VISUAL", "shape": [3, 16, 16]},
    }
    assert config["output_features"] == {"action": {"type": "ACTION", "shape": [3]}}
    assert "embodiments" not in json.loads((arm6 / "policy_preprocessor.json").read_text())
    state = load_file(str(arm6 / step))
    assert sorted(state) == ["action.mean", "action.std", "observation.state.mean", "observation.state.std"]
    assert torch.equal(state["observation.state.mean"], _stats(workdir, ARM6, OBS_KEY)[0])


def test_eval_scores_one_robot_on_its_member_of_the_runs_mixture(
    workdir: Path, trained: Path, monkeypatch
) -> None:
    monkeypatch.chdir(workdir)
    result = run_eval([f"--policy.path={trained}", f"--embodiment={ARM6}", "--batch_size=22"])
    assert (result["frames"], result["episodes"]) == (22, 2)  # dataset_arm6 alone
    assert np.isfinite(result["action_mse"]) and result["baseline_mse"] > 0


def test_an_embodiment_the_checkpoint_lacks_is_one_line_naming_those_it_has(
    workdir: Path, trained: Path, monkeypatch
) -> None:
    monkeypatch.chdir(workdir)
    message = f"{trained} has no embodiment 'arm9': it has {VIDEO}, {ARM6}"
    for attempt in (
        lambda: trainer.load_policy(str(trained), embodiment="arm9"),
        lambda: export_command(
            [f"--policy.path={trained}", f"--output_dir={workdir / 'no'}", "--embodiment=arm9"]
        ),
        lambda: run_eval([f"--policy.path={trained}", "--embodiment=arm9"]),
    ):
        with pytest.raises(ConfigError, match=re.escape(message)) as error:
            attempt()
        assert "\n" not in str(error.value)
    one_robot = (
        f"{LEROBOT_SMOLVLA} was trained on one robot's data and has no embodiments: drop embodiment=arm9"
    )
    with pytest.raises(ConfigError, match=re.escape(one_robot)):
        trainer.load_policy(str(LEROBOT_SMOLVLA), embodiment="arm9")
    assert not (workdir / "no").exists()


def test_the_processors_refuse_statistics_of_an_embodiment_they_do_not_list(trained: Path) -> None:
    processors = ckpt_tools.load_processors(str(trained))
    state = processors["policy_preprocessor"]
    tensors = [dict(t) for t in state.step_tensors]
    tensors[-1]["embodiment.2.action.mean"] = torch.zeros(3)
    with pytest.raises(
        ConfigError, match=re.escape("holds embodiment.2.action.mean, but the config lists 2 embodiments")
    ):
        Processor.from_state(state.config, tensors)
    config = {**state.config, "embodiments": [{"name": VIDEO}]}
    with pytest.raises(ConfigError, match="embodiment 0 is not"):
        Processor.from_state(config, state.step_tensors)


def test_a_streamed_mixture_of_robots_gives_the_local_items(workdir: Path) -> None:
    """--dataset.streaming=true reads each member in place (a local root as file://), at its own fps."""
    local, streamed = _mixture(workdir), _mixture(workdir, "mixture.json", "--dataset.streaming=true")
    indices, chunk = torch.tensor([VIDEO_FRAMES + 9, 5, 61, VIDEO_FRAMES + 20]), Frames.chunk(5)
    a, b = local.gather(indices, chunk), streamed.gather(indices, chunk)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ("--policy.type=act", "the mixture's members disagree on fps (dataset_video 10, dataset_arm6 15): this policy trains on one; resample them to one rate; or train a policy that takes members that differ (--policy.type=smolvla)"),
        ("--policy.type=mlp", "the mixture's members disagree on fps (dataset_video 10, dataset_arm6 15)"),
        ("--policy.type=diffusion", "the mixture's members disagree on action size (dataset_video 2, dataset_arm6 3): this policy trains on one; map their actions to one action space; or train a policy that takes members that differ (--policy.type=smolvla)"),
    ],
)  # fmt: skip
def test_a_policy_that_cannot_take_members_that_differ_is_refused_in_one_line(
    workdir: Path, policy: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)) as error:
        train_in(
            workdir,
            [policy, "--dataset.mixture=mixture.json", "--steps=1", "--num_workers=0", "--output_dir=no"],
        )
    assert "\n" not in str(error.value)


def test_diffusion_trains_on_robots_that_differ_in_fps_and_statistics_only(workdir: Path) -> None:
    """Its conditioning and action channels are the robot's sizes, so the members must agree on them; a
    15 fps robot of the same layout is read at its own fps and normalized by its own statistics."""
    fast = copy_fixture(workdir, "lerobot", "dataset_images")
    info = json.loads((fast / "meta" / "info.json").read_text())
    (fast / "meta" / "info.json").write_text(json.dumps({**info, "fps": 15}))
    (workdir / "fps.json").write_text(json.dumps([{"root": VIDEO}, {"root": "dataset_images"}]))
    flags = ["--policy.type=diffusion", "--policy.pretrained_backbone_weights=null", "--policy.horizon=8",
             "--policy.n_action_steps=4", "--policy.down_dims=[8,16]", "--policy.num_inference_steps=2",
             "--policy.use_separate_rgb_encoder_per_camera=false", "--dataset.mixture=fps.json",
             "--batch_size=2", "--num_workers=0", "--steps=1", "--output_dir=diffusion"]  # fmt: skip
    train_in(workdir, flags)
    model = saved_model(workdir / "diffusion")
    preprocessor = json.loads((model / "policy_preprocessor.json").read_text())
    assert [e["name"] for e in preprocessor["embodiments"]] == [VIDEO, "dataset_images"]
    state = load_file(str(model / preprocessor["steps"][-1]["state_file"]))
    stats = {
        d: json.loads((workdir / d / "meta" / "stats.json").read_text())["action"]
        for d in (VIDEO, "dataset_images")
    }
    for key, dataset in (("action.min", VIDEO), ("embodiment.1.action.max", "dataset_images")):
        expected = torch.tensor(stats[dataset][key.rpartition(".")[2]], dtype=torch.float32)
        torch.testing.assert_close(state[key], expected)  # min/max through our mean/std: float rounding
    assert not torch.allclose(state["action.min"], state["embodiment.1.action.min"])


def test_members_that_differ_in_a_feature_name_the_member_and_the_feature(workdir: Path) -> None:
    """Same fps: the first difference a fixed-layout policy meets is named with its members."""
    write_dataset(workdir / "arm6_10fps", [12, 10], rows_per_file=50, state_size=6, action_size=3)
    path = workdir / "same_rate.json"
    path.write_text(json.dumps([{"root": VIDEO}, {"root": "arm6_10fps"}]))
    config = parse_config([f"--dataset.mixture={path}"]).dataset
    message = "the mixture's members disagree on action size (dataset_video 2, arm6_10fps 3)"
    with pytest.raises(ConfigError, match=re.escape(message)):
        config.load([OBS_KEY])
    write_dataset(workdir / "arm4", [12, 10], rows_per_file=50)
    path.write_text(json.dumps([{"root": VIDEO}, {"root": "arm4"}]))
    config = parse_config([f"--dataset.mixture={path}"]).dataset
    message = f"mixture member 1 (arm4): has no camera {TOP} (its cameras: {FRONT})"
    with pytest.raises(ConfigError, match=re.escape(message)):
        config.load([OBS_KEY, TOP])


def test_held_out_frames_of_members_that_differ_are_counted_per_member(workdir: Path) -> None:
    held_out = parse_config(
        [f"--dataset.mixture={workdir / 'mixture.json'}", "--dataset.eval_split=0.5"]
    ).dataset
    held_out = held_out.serving(True).load_validation([OBS_KEY, ALL_CAMERAS, TASK_KEY])
    assert isinstance(held_out, MixedMixture)
    assert held_out.weighted_order.labels == [VIDEO, ARM6]
    assert [len(member) for member in held_out.members] == list(held_out.weighted_order.sizes)
    assert held_out.gather(torch.tensor([len(held_out) - 1]), Frames.chunk(5))["action"].shape == (1, 5, 3)


def test_one_camera_name_of_two_frame_sizes_is_refused_in_one_line(workdir: Path) -> None:
    """Mapping the 16x16 camera onto the video robot's 24x40 slot would stack frames of two sizes."""
    path = workdir / "one_slot.json"
    path.write_text(json.dumps([{"root": VIDEO}, {"root": ARM6, "rename_map": {FRONT: TOP}}]))
    config = parse_config([f"--dataset.mixture={path}"]).dataset
    message = f"mixture member 1 (dataset_arm6): its camera {TOP} is 3x16x16, another member's 3x24x40"
    with pytest.raises(ConfigError, match=re.escape(message)) as error:
        config.serving(True).load([OBS_KEY, ALL_CAMERAS, TASK_KEY])
    assert "\n" not in str(error.value)
