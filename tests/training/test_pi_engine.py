"""pi0.5 through the engine: LeRobot's tiny checkpoint (tests/fixtures/lerobot_pi05_tiny, its sizes given
by --policy.size_overrides) fine-tuned with --policy.path on LeRobot's camera dataset with its task,
saved, resumed bit for bit, exported in LeRobot's schema (tensors, config.json and the processor files
LeRobot wrote), reloaded with `trainer.load_policy(..., size_overrides=)` and acting through the action
queue; a fresh build on the meta device; the fine-tuning switches; bad inputs refused in one line.

The fixture names its tokenizer by the relative path `tiny_paligemma`: the runs start from a private
copy of it, the dataset beside its checkpoint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

import trainer
from helpers.engine_run import rewound_copy, train_in
from helpers.fixtures import copy_fixture
from helpers.run_outputs import metrics, model_file
from trainer.cli import main
from trainer.cli.parse import parse_config
from trainer.config.sections import PolicySection
from trainer.data.dataset import task_bytes
from trainer.data.pipeline.processors import observation_batch
from trainer.engine import build as model_build
from trainer.engine.plan import resolve_plan
from trainer.errors import ConfigError
from trainer.evaluation.lerobot_export import export_lerobot
from trainer.policies.pi import PI05Config

OVERRIDES = "tiny_paligemma/tiny_pi_overrides.json"
COMMON = [
    f"--policy.size_overrides={OVERRIDES}", "--dataset.root=dataset_video", "--batch_size=2",
    "--num_workers=0", "--log_freq=1",
]  # fmt: skip
TUNE = ["--policy.path=pretrained_model", *COMMON, "--steps=2", "--save_freq=1"]
# A fresh pi0.5 at the fixture's sizes (LeRobot's variant names, resized by the overrides file).
FRESH = [
    "--policy.type=pi05", "--policy.tokenizer_name=tiny_paligemma", "--policy.image_resolution=[32,32]",
    "--policy.chunk_size=5", "--policy.n_action_steps=5", "--policy.num_inference_steps=3", *COMMON,
]  # fmt: skip


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = copy_fixture(tmp_path_factory.mktemp("pi_engine"), "lerobot_pi05_tiny")
    copy_fixture(folder, "lerobot", "dataset_video")
    return folder


@pytest.fixture(scope="module")
def tuned(workdir: Path) -> Path:
    train_in(workdir, [*TUNE, "--output_dir=tuned"])
    return workdir / "tuned" / "checkpoints" / "last"


@pytest.fixture(scope="module")
def exported(workdir: Path, tuned: Path) -> Path:
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(workdir)  # where the run started: the relative names its flags and base gave resolve here
        export_lerobot(str(tuned), str(workdir / "exported"))
    return workdir / "exported"


def _headers(path: Path) -> dict[str, tuple[str, list[int]]]:
    with safe_open(str(path), "pt") as handle:
        slices = {key: handle.get_slice(key) for key in handle.keys()}  # noqa: SIM118
    return {key: (piece.get_dtype(), list(piece.get_shape())) for key, piece in slices.items()}


def test_lerobots_checkpoint_fine_tunes_and_exports_in_its_schema(
    workdir: Path, tuned: Path, exported: Path, monkeypatch
) -> None:
    """The export holds LeRobot's tensors (names, dtypes, shapes: the two unused lm_heads written back),
    its config.json fields and features, and its processor files field for field."""
    monkeypatch.chdir(workdir)
    lerobot = workdir / "pretrained_model"
    assert _headers(exported / "model.safetensors") == _headers(lerobot / "model.safetensors")
    ours, theirs = (json.loads((d / "config.json").read_text()) for d in (exported, lerobot))
    assert ours.keys() == theirs.keys()
    differ = {k for k in theirs if ours[k] != theirs[k]}
    assert differ == {"device"}  # LeRobot's run wrote "cpu"; ours leaves it to LeRobot's auto-detection
    tokenizer = {"tokenizer_name": "tiny_paligemma"}  # LeRobot's relative name; the export's is resolved
    for name in ("policy_preprocessor.json", "policy_postprocessor.json"):
        written = json.loads((exported / name).read_text())
        named = [step["config"] for step in written["steps"] if "tokenizer_name" in step.get("config", {})]
        assert [c["tokenizer_name"] for c in named] == [str(workdir / "tiny_paligemma")] * len(named)
        for config in named:
            config.update(tokenizer)
        assert written == json.loads((lerobot / name).read_text())
    for name in (  # the statistics LeRobot's (un)normalizer reads for QUANTILES: the dataset's q01/q99
        "policy_preprocessor_step_3_normalizer_processor.safetensors",
        "policy_postprocessor_step_0_unnormalizer_processor.safetensors",
    ):
        written, lerobots = load_file(str(exported / name)), load_file(str(lerobot / name))
        assert {key.rpartition(".")[2] for key in written} == {"q01", "q99"}
        assert all(torch.allclose(written[key], lerobots[key], rtol=0, atol=1e-6) for key in written)
    tuned_state = trainer.load_policy(str(tuned)).policy.state_dict()
    back = PI05Config.lerobot_adapter().state_from_lerobot(load_file(str(exported / "model.safetensors")))
    assert back.keys() == tuned_state.keys()
    assert all(torch.equal(back[name], tensor) for name, tensor in tuned_state.items())
    base = PI05Config.lerobot_adapter().state_from_lerobot(load_file(str(lerobot / "model.safetensors")))
    assert not torch.equal(base["model.action_out_proj.weight"], tuned_state["model.action_out_proj.weight"])


def test_a_relative_size_overrides_is_recorded_so_export_works_from_any_directory(
    workdir: Path, tuned: Path, exported: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    """The run was given `--policy.size_overrides=tiny_paligemma/...` relative to its directory, and its
    base names its tokenizer `tiny_paligemma`, relative too: its checkpoint names both absolute, so
    `trainer export` from elsewhere writes the same export."""
    saved = json.loads((tuned / "pretrained_model" / "train_config.json").read_text())["policy"]
    assert saved["size_overrides"] == str(workdir / OVERRIDES)
    assert saved["tokenizer_name"] == str(workdir / "tiny_paligemma")
    assert json.loads((tuned / "pretrained_model" / "config.json").read_text())["size_overrides"] == str(
        workdir / OVERRIDES
    )
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_code:
        main(["export", f"--policy.path={tuned}", "--output_dir=elsewhere"])
    assert exit_code.value.code == 0, capsys.readouterr().err
    here = tmp_path / "elsewhere"
    assert sorted(p.name for p in here.iterdir()) == sorted(p.name for p in exported.iterdir())
    assert all((here / p.name).read_bytes() == p.read_bytes() for p in exported.iterdir())


def test_a_resumed_run_is_bit_exact(workdir: Path, tuned: Path) -> None:
    """Step 2 resumed from step 1 gives the uninterrupted run's model.safetensors bit for bit (the
    flow-matching noise and time come from the restored RNG)."""
    rewound_copy(workdir / "tuned", workdir / "resumed", 1)
    train_in(workdir, ["--resume=true", "--steps=2", "--output_dir=resumed"])
    straight, resumed = (load_file(str(model_file(workdir / run, 2))) for run in ("tuned", "resumed"))
    assert straight.keys() == resumed.keys()
    assert all(torch.equal(straight[name], resumed[name]) for name in straight)


def _train_losses(run: Path) -> list[float]:
    records = metrics(run)
    return [r["loss"] for r in records if r.get("event") == "train"]


def test_bf16_autocast_trains_to_the_float32_runs_loss(workdir: Path, tuned: Path) -> None:
    """--accelerator.mixed_precision=bf16 (autocast) fine-tunes to the float32 run's losses, the same
    seed drawing the same noise and times. They differ (autocast reached the layers) by bfloat16's
    rounding: 8 significant bits (3.9e-3 relative per operand) through SigLIP and two layer pairs move
    the loss by 3e-4 relative at step 1 and 2e-3 after one update, so 1e-2 leaves room and still
    fails on a real error (a wrong mask, a dropped term). It was NaN from step 1: the attention's
    float32-minimum mask rounded to -inf in bfloat16 (vla/attention.py)."""
    train_in(workdir, [*COMMON, "--policy.path=pretrained_model", "--steps=2", "--save_freq=2",
                       "--accelerator.mixed_precision=bf16", "--output_dir=bf16"])  # fmt: skip
    float32, bf16 = _train_losses(workdir / "tuned"), _train_losses(workdir / "bf16")
    assert len(bf16) == len(float32) == 2 and bf16 != float32
    assert bf16 == pytest.approx(float32, rel=1e-2)


def test_the_export_reloads_and_acts_through_the_action_queue(
    workdir: Path, tuned: Path, exported: Path, monkeypatch
) -> None:
    """`load_policy(export, size_overrides=)` acts as our checkpoint does; `select_action` samples one
    chunk per `n_action_steps` calls and serves it in order."""
    monkeypatch.chdir(workdir)
    ours = trainer.load_policy(str(tuned))
    theirs = trainer.load_policy(str(exported), size_overrides=OVERRIDES)
    g = torch.Generator().manual_seed(0)
    observation = {
        "observation.state": torch.randn(2, 4, generator=g),
        "observation.images.top": torch.rand(2, 3, 24, 40, generator=g),
        "observation.images.wrist": torch.rand(2, 3, 24, 40, generator=g),
        "task": ["reach the corner the colour names", "push"],
    }
    steps = theirs.config.n_action_steps
    actions = {}
    for name, loaded in (("ours", ours), ("theirs", theirs)):
        torch.manual_seed(7)
        actions[name] = torch.stack([loaded.select_action(observation) for _ in range(steps + 1)])
    torch.testing.assert_close(actions["theirs"], actions["ours"], rtol=0, atol=0)
    batch, _ = observation_batch(observation, theirs.input_features)
    torch.manual_seed(7)
    chunk = theirs.postprocessor({"action": theirs.policy.predict_action_chunk(theirs.preprocessor(batch))})
    assert torch.equal(actions["theirs"][:steps], chunk["action"].transpose(0, 1))
    assert not torch.equal(actions["theirs"][steps], actions["theirs"][0])  # a new chunk after the queue


def test_a_fresh_policy_builds_on_the_meta_device_as_lerobot_initializes_it(
    workdir: Path, monkeypatch
) -> None:
    """Every module is initialized after the meta build: the computed buffers (RoPE tables, the token
    embedding's sqrt(width), SigLIP's position ids) as an eager build computes them, the norms and
    adaRMS denses at zero, transformers' normal(0, 0.02) on Gemma's weights."""
    monkeypatch.chdir(workdir)
    plan, _ = resolve_plan(parse_config([*FRESH, "--output_dir=fresh"]), 1)
    notes: list[str] = []
    built = model_build.build(plan.policy, False, 4, 2, notes)
    assert built.on_meta and not notes
    model_build.before_prepare(built, plan.policy, torch.device("cpu"))
    eager = model_build.build_policy(plan.policy.policy, 4, 2)
    buffers, computed = dict(built.policy.named_buffers()), dict(eager.named_buffers())
    assert buffers.keys() == computed.keys() and len(buffers) == 4
    assert all(torch.equal(buffers[name], computed[name]) for name in buffers)
    params = dict(built.policy.named_parameters())
    zeros = [
        p
        for n, p in params.items()
        if "vision_tower" not in n and n.endswith(("norm.weight", "dense.weight"))
    ]
    assert zeros and all(not p.any() for p in zeros)
    embed = params["model.paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"]
    assert 0.015 < embed.std().item() < 0.025 and not embed[0].any()  # the padding row


def _built_from_lerobots(overrides: str) -> tuple[model_build.BuiltPolicy, PolicySection]:
    """One process's build for a fine-tune of LeRobot's checkpoint (the working directory its folder)."""
    flags = ["--policy.path=pretrained_model", *COMMON, f"--policy.size_overrides={overrides}"]
    section = resolve_plan(parse_config([*flags, "--output_dir=from_lerobot"]), 1)[0].policy
    return model_build.build(section, False, 4, 2, []), section


def test_lerobots_checkpoint_streams_by_its_names_into_a_meta_build(workdir: Path, monkeypatch) -> None:
    """LeRobot's names read under its adapter's renaming (`names_from_lerobot`) into a policy built on
    the meta device: it then holds exactly the file's tensors (renamed as `state_from_lerobot` names
    them, the lm_heads dropped)."""
    monkeypatch.chdir(workdir)
    built, section = _built_from_lerobots(OVERRIDES)
    assert built.on_meta and built.saved_names is not None
    model_build.before_prepare(built, section, torch.device("cpu"))
    held = built.policy.state_dict()
    lerobots = PI05Config.lerobot_adapter().state_from_lerobot(
        load_file("pretrained_model/model.safetensors")
    )
    assert held.keys() == lerobots.keys() and all(torch.equal(held[k], lerobots[k]) for k in held)


def test_lerobots_checkpoint_that_does_not_fit_is_refused_from_its_headers(
    workdir: Path, tmp_path: Path, monkeypatch
) -> None:
    """Three layer pairs for the checkpoint's two: the first missing tensor named in one line, under our
    names, before anything is allocated."""
    monkeypatch.chdir(workdir)
    sizes = json.loads(Path(OVERRIDES).read_text())
    for variant in sizes["gemma_variants"].values():
        variant["depth"] = 3
    deeper = tmp_path / "deeper.json"
    deeper.write_text(json.dumps(sizes))
    with pytest.raises(ConfigError, match=(
        r"^--policy.path=pretrained_model: its weights do not fit the PI05Policy built from the flags "
        r"\(\d+ missing, 0 unexpected; missing model.paligemma_with_expert.layers.2.")) as raised:  # fmt: skip
        _built_from_lerobots(str(deeper))
    assert "\n" not in str(raised.value)


def test_gradient_checkpointing_gives_the_same_loss_and_gradients(workdir: Path, monkeypatch) -> None:
    monkeypatch.chdir(workdir)
    reference = load_file("reference.safetensors")
    batch = {k.removeprefix("pre."): v for k, v in reference.items() if k.startswith("pre.")}
    results = []
    for checkpointing in (False, True):
        policy = trainer.load_policy(
            "pretrained_model", size_overrides=OVERRIDES, gradient_checkpointing=checkpointing
        ).policy.train()
        loss, _ = policy(batch, noise=reference["loss.noise"], time=reference["loss.time"])
        loss.backward()
        results.append((loss, {n: p.grad for n, p in policy.named_parameters() if p.grad is not None}))
    (loss, grads), (checkpointed, again) = results
    assert torch.equal(loss, checkpointed) and grads.keys() == again.keys()
    assert all(torch.equal(grads[n], again[n]) for n in grads)


@pytest.mark.parametrize(
    ("flag", "trained"),
    [
        ("--policy.train_expert_only=true", ("layers.0.expert.", "gemma_expert.model.norm.", "model.action_", "model.time_mlp")),
        ("--policy.freeze_vision_encoder=true", ("layers.0.", "language_model.embed_tokens.", "multi_modal_projector.", "model.action_")),
    ],
)  # fmt: skip
def test_the_fine_tuning_switches_freeze_what_lerobot_freezes(
    workdir: Path, monkeypatch, flag: str, trained: tuple
) -> None:
    monkeypatch.chdir(workdir)
    plan, _ = resolve_plan(parse_config([*FRESH, flag, "--output_dir=switches"]), 1)
    policy = model_build.build_policy_on_meta(plan.policy, 4, 2)
    names = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert all(any(part in n for n in names) for part in trained)
    assert not any("vision_tower" in n for n in names)
    if "train_expert_only" in flag:
        assert not any(".paligemma." in n or "language_model" in n for n in names)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--policy.paligemma_variant=gemma_7b"], r"--policy.paligemma_variant='gemma_7b' is not a LeRobot variant: choose one of gemma_300m, gemma_2b$"),
        (["--policy.image_resolution=[36,36]"], r"--policy.image_resolution=\[36, 36\] is not a multiple of SigLIP's patch size 8: give a multiple of 8"),
        (["--policy.image_resolution=[32,40]"], r"--policy.image_resolution=\[32, 40\]: PaliGemma takes square images"),
        (["--policy.use_relative_actions=true"], r"--policy.use_relative_actions=true is not supported yet"),
        (["--policy.compile_model=true"], r"--policy.compile_model=true: compile with --accelerator.compile=true instead$"),
        (["--policy.dropout=0.1"], r"--policy.dropout=0.1: pi0 has no dropout; leave it at 0$"),
    ],
)  # fmt: skip
def test_bad_flags_are_refused_in_one_line(
    workdir: Path, monkeypatch, flags: list[str], message: str
) -> None:
    monkeypatch.chdir(workdir)
    with pytest.raises(ConfigError, match=message) as raised:
        parse_config([*FRESH, *flags, "--output_dir=refused"])
    assert "\n" not in str(raised.value)


def test_real_time_chunking_in_a_checkpoint_is_refused_in_one_line(workdir: Path, tmp_path: Path) -> None:
    checkpoint = shutil.copytree(workdir / "pretrained_model", tmp_path / "rtc")
    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps({**config, "rtc_config": {"enabled": True}}))
    with pytest.raises(ConfigError, match=r"--policy.rtc_config \(real-time chunking\) is not supported"):
        trainer.load_policy(str(checkpoint), size_overrides=str(workdir / OVERRIDES))


def test_a_pi0_checkpoint_without_its_tokenizer_is_refused_in_one_line(tmp_path: Path, monkeypatch) -> None:
    """LeRobot's pi0 checkpoint names its tokenizer `tiny_paligemma` (its policy_preprocessor.json), a
    relative path that does not resolve from here; nothing downloads."""
    fixture = copy_fixture(tmp_path, "lerobot_pi0_tiny")
    copy_fixture(tmp_path, "lerobot", "dataset_video")
    overrides = str(fixture / OVERRIDES)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        ConfigError, match=r"^--policy.tokenizer_name=tiny_paligemma: no such directory"
    ) as raised:
        trainer.load_policy(str(fixture / "pretrained_model"), size_overrides=overrides)
    assert "\n" not in str(raised.value)
    with pytest.raises(ConfigError, match=r"^--policy.tokenizer_name=tiny_paligemma: no such directory"):
        train_in(tmp_path, [f"--policy.path={fixture / 'pretrained_model'}", *COMMON[1:],
                            f"--policy.size_overrides={overrides}", "--output_dir=untokenized"])  # fmt: skip


def test_the_task_reaches_the_prompt(workdir: Path, monkeypatch) -> None:
    """The engine's batches carry each frame's task as bytes: pi0.5's prompt is the task and the
    normalized state's bins (a batch without a task is one line)."""
    monkeypatch.chdir(workdir)
    policy = trainer.load_policy("pretrained_model", size_overrides=OVERRIDES).policy
    state = torch.zeros(1, 4)
    assert policy.tokenizer.prompts(["reach"], state) == ["Task: reach, State: 128 128 128 128;\nAction: "]
    batch = {"observation.state": state, "observation.images.top": torch.rand(1, 3, 24, 40)}
    with pytest.raises(ValueError, match=r"needs 'observation\.language\.tokens' or 'task'"):
        policy.predict_action_chunk(batch)
    batch["task"] = task_bytes(["reach"])
    assert policy.predict_action_chunk(batch).shape == (1, 5, 2)
