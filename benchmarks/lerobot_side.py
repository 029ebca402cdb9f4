"""Does LeRobot 0.6.1 itself read what this trainer exports, and act as we do? Two halves, two venvs.

`ours` (this project's venv) exports a checkpoint of ours with `trainer export` into
`WORKDIR/pretrained_model/`, draws a seeded batch of normalized model inputs under LeRobot's batch keys
(ACT: `observation.state`, `observation.environment_state`, each camera; SmolVLA, pi0, pi0.5: the
state, the cameras in [0, 1], the prompt's tokens and mask (pi0.5's with the state's bins), and the
flow-matching noise; Diffusion Policy: the state and cameras with their `n_obs_steps` history, and the
initial noise) and writes them with our action chunk to `WORKDIR/expected.safetensors`.

It also draws a seeded raw observation (cameras float in [0, 1] as LeRobot's dataset gives them, the
state, the VLAs' task strings) and writes our `trainer.load_policy(export).select_action` on it for the
whole first chunk (`n_action_steps` calls through the action queue; the VLAs' noise from a fixed seed).
A pi0/pi0.5 export reloads with the checkpoint's `size_overrides` (its config.json names LeRobot's
variants only).

`lerobot` (a separate Python 3.12 venv, this project not needed there:
`python3.12 -m venv ~/lerobot-venv && ~/lerobot-venv/bin/pip install "lerobot[smolvla,diffusion,pi]==0.6.1"
"torch==2.11.0" num2words`) loads `WORKDIR/pretrained_model` with LeRobot's
`ACTPolicy`, `SmolVLAPolicy`, `DiffusionPolicy`, `PI0Policy` or `PI05Policy.from_pretrained(dir,
strict=True)` (for pi, with the LeRobot fixture's `tiny_pi.py` imported first when the working directory
holds it: it shrinks LeRobot's hard-coded sizes to the fixture's; and a check that LeRobot holds the
exported tensors, since its pi `from_pretrained` keeps random weights with a warning otherwise), computes
`predict_action_chunk` on the same normalized inputs (the same seed before it: DDPM's steps draw noise) and compares with ours; then loads our
processor files with LeRobot's `make_pre_post_processors(policy.config, pretrained_path=dir)` and runs
the raw observation through LeRobot's preprocessor -> `select_action` -> postprocessor (the same seed
before each call) against our unnormalized actions. It prints the largest difference of each and exits 1
above --atol (LeRobot's own re-runs of SmolVLA differ by ~2e-7; float32).

A SmolVLA's config names its backbone (`vlm_model_name`): run both halves from a directory where that
name resolves (a relative path, or a Hub id in the HF cache). Never part of the tests or `nox -s bench`.

`check` does the whole round in a scratch directory (`nox -s lerobot_side` runs it): it trains an ACT
with two cameras, a SmolVLA on the tiny backbone and a small Diffusion Policy here, 3 steps each on the fixture dataset
`tests/fixtures/lerobot/dataset_video`, an ACT from LeRobot's own flags on LeRobot's `dataset_tiny` (its
`observation.environment_state` read as its own token, no camera), a Diffusion Policy on `dataset_tiny`
conditioned on its `observation.environment_state` (no camera), and fine-tunes LeRobot's own Diffusion checkpoint
(`tests/fixtures/lerobot_diffusion_tiny`) for 3 steps on FSDP2 x2 with an EMA in one torchrun launch
(2 gloo ranks; its export holds the EMA's weights), and fine-tunes LeRobot's own tiny pi0.5 checkpoint
(`tests/fixtures/lerobot_pi05_tiny`) for 3 steps on FSDP2 x2, and LeRobot's own tiny FastWAM
(`tests/fixtures/lerobot_fastwam_tiny`, on its dataset, with its frozen `tiny_wan/` and its launcher
`tiny_fastwam.py` imported on LeRobot's side) for 3 steps on FSDP2 x2, then runs `ours` in this venv and `lerobot` in
--lerobot-python's on each. It also trains the SmolVLA on two robots that differ (`dataset_video` beside
`dataset_arm6`: state 4/6, action 2/3, two video cameras vs one image camera, 10/15 fps) and checks each
robot's export (`ours --embodiment=NAME`), against our `load_policy(checkpoint, embodiment=NAME)` on that
robot's raw observation.
Measured with lerobot 0.6.1 (torch 2.11, CPU): all load with strict=True; max |LeRobot - ours| is
2.98e-7 for the ACT's chunk and 0 for the SmolVLA's; through LeRobot's own processors on the raw
observation, 1.34e-7 for the ACT's actions and 0 for the SmolVLA's (docs/vla.md); the ACT from LeRobot's
flags on `dataset_tiny` (environment state as its own token, 2026-12-06): chunk 1.49e-7, actions 1.19e-7; the Diffusion
Policy's chunk 0, its actions through LeRobot's processors 4.17e-7; with the environment state, chunk 0
and 8.64e-7; the FSDP2 + EMA fine-tune of LeRobot's checkpoint: chunk 0, actions through LeRobot's
processors 1.49e-7; the two-robot SmolVLA's exports, each loaded strictly, chunk 0 and actions through
LeRobot's processors 0 for both robots; the pi0.5's (fine-tuned on FSDP2 x2 since 2026-12-04) chunk 0, its actions through LeRobot's processors
(QUANTILES normalizer, the state written into the prompt, the tokenizer) 2.98e-8 and 1.49e-8 on two runs.

`main-resume` is the way back, against LeRobot main (installed from its source in another venv):
a step of ours exported with `trainer export --lerobot_step=true` and continued by LeRobot main's own
`lerobot-train --resume=true` on FSDP2 x2; what LeRobot restored equals our step bit for bit and it
trains on (benchmarks/lerobot_main_resume.py, where the measured numbers are).

Usage:
  python benchmarks/lerobot_side.py main-resume --lerobot-main-python /path/to/lerobot-main-venv/bin/python
  python benchmarks/lerobot_side.py check --lerobot-python /path/to/lerobot-venv/bin/python [--atol 1e-5]
  python benchmarks/lerobot_side.py ours --policy.path=outputs/run/checkpoints/last WORKDIR [--batch 3]
      [--embodiment=NAME]
  /path/to/lerobot-venv/bin/python benchmarks/lerobot_side.py lerobot WORKDIR [--atol 1e-5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import lerobot_main_resume  # the way back, against LeRobot main (a sibling: benchmarks/ is on sys.path)
import torch
from safetensors.torch import load_file, save_file

EXPECTED = "expected.safetensors"
RAW = "raw."  # the raw observation both sides' processors take (cameras float in [0, 1], the state)
SELECTED = "expected.selected"  # our `load_policy(...).select_action` on it, step after step (S, B, A)
MODEL_DIR = "pretrained_model"
OUT = "expected.actions"  # our chunk (B, chunk_size, action_dim), normalized
NOISE = "expected.noise"  # SmolVLA's flow-matching noise, passed to both
TOKENS, TOKEN_MASK = "observation.language.tokens", "observation.language.attention_mask"
TASKS = ["pick up the red block", "push"]
PI = ("pi0", "pi05")
LANGUAGE = ("smolvla", "fastwam", *PI)  # the policies whose observation holds the task
FIXTURES = Path(__file__).parents[1] / "tests" / "fixtures"
# What `check` trains here (from its scratch directory, which holds the dataset and the backbone)
RUN = ["--batch_size=2", "--num_workers=0", "--steps=3", "--save_freq=3"]
COMMON = ["--dataset.root=dataset_video", *RUN]
# ... and a SmolVLA on two robots that differ (state 4/6, action 2/3, two video cameras vs one image
# camera, 10/15 fps), exported for each of them
MIXED_ROBOTS = ("dataset_video", "dataset_arm6")
MIXED = ["--dataset.mixture=mixture.json", *RUN]
TRAIN = {
    "act": [
        "--policy.type=act", "--policy.dim_model=16", "--policy.n_heads=2", "--policy.dim_feedforward=32",
        "--policy.n_encoder_layers=1", "--policy.n_vae_encoder_layers=1", "--policy.latent_dim=4",
        "--policy.chunk_size=4", "--policy.n_action_steps=4", "--policy.pretrained_backbone_weights=null",
    ],
    "act_env": [  # LeRobot's own flags on dataset_tiny: its observation.environment_state read as a token
        "--policy.type=act", "--policy.dim_model=16", "--policy.n_heads=2", "--policy.dim_feedforward=32",
        "--policy.n_encoder_layers=1", "--policy.n_vae_encoder_layers=1", "--policy.latent_dim=4",
        "--policy.chunk_size=4", "--policy.n_action_steps=4", "--dataset.root=dataset_tiny",
    ],
    "smolvla": [
        "--policy.type=smolvla", "--policy.vlm_model_name=tiny_smolvlm", "--policy.load_vlm_weights=false",
        "--policy.chunk_size=5", "--policy.n_action_steps=5", "--policy.num_vlm_layers=4",
        "--policy.num_steps=3", "--policy.resize_imgs_with_padding=[32,32]",
    ],
    "diffusion": [
        "--policy.type=diffusion", "--policy.pretrained_backbone_weights=null", "--policy.horizon=8",
        "--policy.n_action_steps=4", "--policy.down_dims=[16,32,64]", "--policy.num_inference_steps=10",
        "--policy.use_separate_rgb_encoder_per_camera=false",
    ],
    "diffusion_env": [  # LeRobot's dataset_tiny: no camera, its own observation.environment_state
        "--policy.type=diffusion", "--policy.horizon=8", "--policy.n_action_steps=4",
        "--policy.down_dims=[16,32,64]", "--policy.num_inference_steps=10", "--dataset.root=dataset_tiny",
        "--policy.input_features=[observation.state,observation.environment_state]", "--policy.env_state_dim=3",
    ],
}  # fmt: skip
# LeRobot's own tiny pi0.5 checkpoint (tests/fixtures/lerobot_pi05_tiny) fine-tuned at its sizes on FSDP2 x2
PI05_SHARDED_TUNE = [
    "--policy.path=pi05_base", "--policy.size_overrides=tiny_paligemma/tiny_pi_overrides.json",
    "--parallelism.dp_shard=2",
]  # fmt: skip
# LeRobot's own tiny FastWAM checkpoint (tests/fixtures/lerobot_fastwam_tiny) fine-tuned on its dataset on
# FSDP2 x2 (its config names the frozen parts `./tiny_wan`, copied beside it), with the gripper toggle on its
# last action dimension: LeRobot's postprocessor step for it acts on our export as ours does
FASTWAM_SHARDED_TUNE = [
    "--policy.path=fastwam_base", "--dataset.root=fastwam_dataset", "--dataset.repo_id=local/fastwam_tiny",
    "--parallelism.dp_shard=2", "--policy.toggle_action_dimensions=[-1]",
]  # fmt: skip
# LeRobot's own Diffusion checkpoint (tests/fixtures/lerobot_diffusion_tiny) fine-tuned here on 2 gloo
# ranks, FSDP2 with an EMA, in one torchrun launch: its export holds the EMA's weights.
SHARDED_TUNE = [
    "--policy.path=lerobot_diffusion_tiny/pretrained_model", "--parallelism.dp_shard=2", "--ema.enable=true",
    "--use_policy_training_preset=false", "--optimizer.type=adam", "--optimizer.lr=1e-3",
    "--scheduler.type=constant", "--scheduler.warmup_steps=0",
]  # fmt: skip


def ours(path: str, workdir: Path, batch_size: int, embodiment: str | None = None) -> None:
    """Export `path` (its EMA's weights when it keeps one, as `trainer export` and `load_policy` choose;
    for one `embodiment` of a policy trained on several robots), draw the inputs, compute our chunk,
    write them (this project's venv)."""
    from trainer.evaluation.lerobot_export import export_lerobot

    export_lerobot(path, str(workdir / MODEL_DIR), embodiment=embodiment)
    with torch.no_grad():
        _write_expected(
            workdir, batch_size, path if embodiment else None, embodiment, _unrecorded_fields(path)
        )


def _unrecorded_fields(path: str) -> dict[str, str]:
    """What LeRobot's config.json does not record and our checkpoint's does: a pi0's size overrides
    (the export reloads here with them, as `load_policy(export, size_overrides=)`)."""
    import ckpt_tools

    overrides = ckpt_tools.open_checkpoint(path).policy_config().get("size_overrides")
    return {"size_overrides": overrides} if overrides else {}


def seeded_inputs(config: dict, batch_size: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    """A batch of every input feature a LeRobot config.json lists, drawn from `g`: cameras uniform in
    [0, 1], vectors standard normal (both sides read the same values)."""
    inputs: dict[str, torch.Tensor] = {}
    for name, feature in config["input_features"].items():
        shape = (batch_size, *feature["shape"])
        visual = feature["type"] == "VISUAL"
        inputs[name] = torch.rand(shape, generator=g) if visual else torch.randn(shape, generator=g)
    return inputs


def _write_expected(
    workdir: Path,
    batch_size: int,
    checkpoint: str | None = None,
    embodiment: str | None = None,
    fields: dict[str, str] | None = None,
) -> None:
    """Draw seeded inputs for the exported policy, compute our chunk, write both: from the export (with
    the config `fields` LeRobot's config.json does not record), or for one embodiment from the
    `checkpoint` itself (`load_policy(checkpoint, embodiment=)`, what the export must act as)."""
    import trainer

    if checkpoint is None:
        loaded = trainer.load_policy(str(workdir / MODEL_DIR), **(fields or {}))
    else:
        loaded = trainer.load_policy(checkpoint, embodiment=embodiment)
    policy, config = loaded.policy.eval(), json.loads((workdir / MODEL_DIR / "config.json").read_text())
    g = torch.Generator().manual_seed(0)
    inputs = seeded_inputs(config, batch_size, g)
    if config["type"] == "act":
        chunk = policy.predict_chunk(one_state_vector(inputs, config))
    elif config["type"] == "diffusion":  # the observation history (B, n_obs_steps, ...) and the noise
        inputs = {k: torch.stack([v] * config["n_obs_steps"], dim=1) for k, v in inputs.items()}
        noise = torch.randn(
            (batch_size, config["horizon"], config["output_features"]["action"]["shape"][0]), generator=g
        )
        torch.manual_seed(SEED)  # DDPM's steps draw their variance noise: LeRobot's draws it alike
        chunk = policy.predict_action_chunk(one_state_vector(inputs, config), noise=noise)
        inputs[NOISE] = noise
    elif config["type"] == "fastwam":  # the current frame and the task; the noise from inference_seed
        chunk = policy.predict_action_chunk(
            {**inputs, "task": [TASKS[i % len(TASKS)] for i in range(batch_size)]}
        )
    else:  # SmolVLA, pi0, pi0.5: the prompt's tokens (pi0.5's hold the normalized state) and the noise
        prompts = [TASKS[i % len(TASKS)] for i in range(batch_size)]
        state = (inputs["observation.state"],) if config["type"] in PI else ()
        tokens, mask = policy.tokenizer(prompts, *state)
        inputs[TOKENS], inputs[TOKEN_MASK] = tokens, mask
        shape = (batch_size, config["chunk_size"], config["max_action_dim"])
        noise = torch.randn(shape, generator=g)
        chunk = policy.predict_action_chunk(dict(inputs), noise=noise)
        inputs[NOISE] = noise
    raw = seeded_raw(config, batch_size, g)
    tasks = [TASKS[i % len(TASKS)] for i in range(batch_size)]
    observation = {**raw, **({"task": tasks} if config["type"] in LANGUAGE else {})}
    selected = []
    loaded.reset()
    for _ in range(config["n_action_steps"]):  # the whole first chunk, through the action queue
        torch.manual_seed(SEED)  # the VLAs' and Diffusion's noise: LeRobot's select_action draws it alike
        selected.append(loaded.select_action(observation))
    tensors = {**inputs, OUT: chunk.contiguous(), SELECTED: torch.stack(selected).contiguous()}
    tensors.update({RAW + name: value for name, value in raw.items()})
    metadata = {"type": config["type"], "tasks": json.dumps(tasks), "embodiment": embodiment or ""}
    save_file(tensors, str(workdir / EXPECTED), metadata=metadata)
    print(f"wrote {workdir / MODEL_DIR} and {workdir / EXPECTED}: {config['type']} chunk {list(chunk.shape)}")


SEED = 7


def one_state_vector(inputs: dict[str, torch.Tensor], config: dict) -> dict[str, torch.Tensor]:
    """LeRobot's batch as ours: its robot state and environment state are one `observation.state`
    here (the robot's first), the cameras as they are."""
    vectors = [inputs[k] for k in ("observation.state", "observation.environment_state") if k in inputs]
    cameras = {k: v for k, v in inputs.items() if config["input_features"][k]["type"] == "VISUAL"}
    return {**cameras, "observation.state": torch.cat(vectors, dim=-1)}


def seeded_raw(config: dict, batch_size: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    """A raw observation as a LeRobot dataset gives it: each camera float in [0, 1], the robot state
    around the dataset's scale (the processors normalize both), every input feature of config.json."""
    return {
        name: torch.rand((batch_size, *f["shape"]), generator=g)
        if f["type"] == "VISUAL"
        else 3 * torch.randn((batch_size, *f["shape"]), generator=g)
        for name, f in config["input_features"].items()
        if not name.startswith("observation.images.empty_camera_")
    }


def lerobot(workdir: Path, atol: float) -> int:
    """Load with LeRobot, act on the saved inputs, compare (the LeRobot venv)."""
    from safetensors import safe_open

    try:
        import lerobot  # noqa: F401
    except ImportError:
        print("error: lerobot is not installed in this Python: run this half in a venv with lerobot==0.6.1")
        return 2

    with safe_open(str(workdir / EXPECTED), "pt") as handle:
        metadata = handle.metadata() or {}
    kind, tasks = metadata["type"], json.loads(metadata["tasks"])
    saved = load_file(str(workdir / EXPECTED))
    expected, selected = saved.pop(OUT), saved.pop(SELECTED)
    raw = {name.removeprefix(RAW): saved.pop(name) for name in list(saved) if name.startswith(RAW)}
    noise = saved.pop(NOISE, None)
    if kind == "act":
        from lerobot.policies.act.modeling_act import ACTPolicy

        policy = ACTPolicy.from_pretrained(str(workdir / MODEL_DIR), strict=True)
        policy.eval()
        actions = policy.predict_action_chunk(saved)
    elif kind == "diffusion":
        from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy

        policy = DiffusionPolicy.from_pretrained(str(workdir / MODEL_DIR), strict=True)
        policy.eval()
        torch.manual_seed(SEED)
        actions = policy.predict_action_chunk(saved, noise=noise)
    elif kind == "fastwam":
        sys.path.insert(0, os.getcwd())
        import tiny_fastwam  # noqa: F401  (the fixture's launcher: LeRobot's hard-coded VAE repo -> ./tiny_wan)
        from lerobot.policies.fastwam.modeling_fastwam import FastWAMPolicy

        policy = FastWAMPolicy.from_pretrained(str(workdir / MODEL_DIR), strict=True)
        _check_loaded(policy, workdir)
        actions = policy.predict_action_chunk({**saved, "task": list(tasks)})
    elif kind in PI:
        if Path("tiny_pi.py").is_file():  # the LeRobot fixture's launcher: LeRobot's sizes shrunk to its own
            sys.path.insert(0, os.getcwd())
            import tiny_pi  # noqa: F401
        from lerobot.policies.pi0 import PI0Policy
        from lerobot.policies.pi05 import PI05Policy

        policy = {"pi0": PI0Policy, "pi05": PI05Policy}[kind].from_pretrained(
            str(workdir / MODEL_DIR), strict=True
        )
        _check_loaded(policy, workdir)
        actions = policy.predict_action_chunk(saved, noise=noise)
    else:
        from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy

        policy = SmolVLAPolicy.from_pretrained(str(workdir / MODEL_DIR), strict=True)
        policy.eval()
        actions = policy.predict_action_chunk(saved, noise=noise)
    actions = actions.float().cpu()
    if actions.shape != expected.shape:
        print(f"FAIL: LeRobot's chunk is {tuple(actions.shape)}, ours {tuple(expected.shape)}")
        return 1
    diff = (actions - expected).abs().max().item()
    verdict = "OK" if diff <= atol else "FAIL"
    print(f"{verdict}: {kind} loaded strictly by LeRobot; max |LeRobot - ours| = {diff:.3g} (atol {atol:g})")
    return max(0 if diff <= atol else 1, _processors_round(policy, workdir, raw, tasks, kind, selected, atol))


def _check_loaded(policy, workdir: Path) -> None:
    """LeRobot's pi0/pi0.5 `from_pretrained` prints a warning and keeps its random weights when the
    file does not fit: check that every tensor of the export is what the policy holds."""
    exported = load_file(str(workdir / MODEL_DIR / "model.safetensors"))
    held = policy.state_dict()
    wrong = [name for name, tensor in exported.items() if not torch.equal(held[name].cpu(), tensor)]
    if wrong or held.keys() != exported.keys():
        raise SystemExit(
            f"FAIL: LeRobot's policy does not hold the exported weights ({(wrong or ['keys'])[0]})"
        )


def _processors_round(policy, workdir: Path, raw, tasks, kind: str, selected, atol: float) -> int:
    """LeRobot's `make_pre_post_processors(pretrained_path=export)` around its policy, on our raw
    observation: preprocessor -> select_action -> postprocessor, step after step, against ours."""
    from lerobot.policies.factory import make_pre_post_processors

    pre, post = make_pre_post_processors(policy.config, pretrained_path=str(workdir / MODEL_DIR))
    policy.reset()
    steps = []
    for _ in range(selected.shape[0]):
        batch = pre({**raw, **({"task": list(tasks)} if kind in LANGUAGE else {})})
        torch.manual_seed(SEED)
        steps.append(post(policy.select_action(batch)).float().cpu())
    actions = torch.stack(steps)
    names = [type(step).__name__ for step in (*pre.steps, *post.steps)]
    if actions.shape != selected.shape:
        print(f"FAIL: LeRobot's processed actions are {tuple(actions.shape)}, ours {tuple(selected.shape)}")
        return 1
    diff = (actions - selected).abs().max().item()
    verdict = "OK" if diff <= atol else "FAIL"
    print(
        f"{verdict}: {kind} processors loaded by LeRobot's make_pre_post_processors ({', '.join(names)}); "
        f"raw observation -> {selected.shape[0]} unnormalized actions, max |LeRobot - ours| = {diff:.3g} "
        f"(atol {atol:g})"
    )
    return 0 if diff <= atol else 1


def check(lerobot_python: str, atol: float) -> int:
    """Train each policy of TRAIN here, a SmolVLA on two robots that differ (MIXED), and fine-tune
    LeRobot's Diffusion checkpoint on FSDP2 x2 with an EMA (SHARDED_TUNE) and LeRobot's tiny pi0.5 on
    FSDP2 x2 (PI05_SHARDED_TUNE) and LeRobot's tiny FastWAM on FSDP2 x2 (FASTWAM_SHARDED_TUNE), then run
    both halves on each
    (on each robot's export for the mixed one); 0 when LeRobot agrees on all."""
    failed = 0
    with tempfile.TemporaryDirectory(prefix="lerobot_side_") as tmp:
        work = Path(tmp)
        for dataset in ("dataset_video", "dataset_arm6"):
            shutil.copytree(FIXTURES / "lerobot" / dataset, work / dataset)
        shutil.copytree(FIXTURES / "lerobot_smolvla_tiny" / "tiny_smolvlm", work / "tiny_smolvlm")
        shutil.copytree(FIXTURES / "lerobot" / "dataset_tiny", work / "dataset_tiny")
        shutil.copytree(FIXTURES / "lerobot_diffusion_tiny", work / "lerobot_diffusion_tiny")
        pi05 = FIXTURES / "lerobot_pi05_tiny"  # its checkpoint, tokenizer, and LeRobot's size launcher
        shutil.copytree(pi05 / "pretrained_model", work / "pi05_base")
        shutil.copytree(pi05 / "tiny_paligemma", work / "tiny_paligemma")
        shutil.copy(pi05 / "tiny_pi.py", work / "tiny_pi.py")
        fastwam = FIXTURES / "lerobot_fastwam_tiny"  # its checkpoint, dataset, frozen parts, VAE launcher
        shutil.copytree(fastwam / "pretrained_model", work / "fastwam_base")
        shutil.copytree(fastwam / "dataset", work / "fastwam_dataset")
        shutil.copytree(fastwam / "tiny_wan", work / "tiny_wan")
        shutil.copy(fastwam / "tiny_fastwam.py", work / "tiny_fastwam.py")
        (work / "mixture.json").write_text(json.dumps([{"root": name} for name in MIXED_ROBOTS]))
        trainer_cli = [sys.executable, "-m", "trainer.cli", "train"]
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
        # (kind, command, flags, robots): a run's own flags after COMMON's, so that they win
        runs = [(kind, trainer_cli, [*COMMON, *flags], [None]) for kind, flags in TRAIN.items()]
        runs.append(("smolvla_mixed", trainer_cli, [*TRAIN["smolvla"], *MIXED], list(MIXED_ROBOTS)))
        sharded = [*torchrun, "--rdzv-endpoint=localhost:0", *trainer_cli[1:]]
        runs.append(("diffusion_fsdp2_ema", sharded, [*COMMON, *SHARDED_TUNE], [None]))
        runs.append(("pi05_fsdp2", sharded, [*COMMON, *PI05_SHARDED_TUNE], [None]))
        runs.append(("fastwam_fsdp2", sharded, [*COMMON, *FASTWAM_SHARDED_TUNE], [None]))
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        script = str(Path(__file__).resolve())
        for kind, command, flags, robots in runs:
            run = f"{kind}_run"
            train = [*command, *flags, f"--output_dir={run}"]
            subprocess.run(train, cwd=work, env=env, check=True, stdout=subprocess.DEVNULL)
            for robot in robots:
                side = work / (f"{kind}_check" if robot is None else f"{kind}_{robot}_check")
                side.mkdir()
                ours_half = [
                    sys.executable,
                    script,
                    "ours",
                    f"--policy.path={run}/checkpoints/last",
                    str(side),
                ]
                print(f"{kind}:" if robot is None else f"robot {robot} of the mixture:", flush=True)
                if robot is not None:
                    ours_half.append(f"--embodiment={robot}")
                subprocess.run(ours_half, cwd=work, env=env, check=True)
                theirs = [lerobot_python, script, "lerobot", str(side), f"--atol={atol}"]
                failed |= subprocess.run(theirs, cwd=work, env=env).returncode != 0
    return 1 if failed else 0


def main() -> int:
    form = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=form)
    sub = parser.add_subparsers(dest="side", required=True)
    mine = sub.add_parser("ours", help="export and write the expected actions (this project's venv)")
    mine.add_argument("--policy.path", dest="path", required=True)
    mine.add_argument("workdir", type=Path)
    mine.add_argument("--batch", type=int, default=3)
    mine.add_argument("--embodiment", default=None, help="the robot of a policy trained on several")
    theirs = sub.add_parser("lerobot", help="load with LeRobot 0.6.1 and compare (LeRobot's venv)")
    theirs.add_argument("workdir", type=Path)
    theirs.add_argument("--atol", type=float, default=1e-5)
    both = sub.add_parser("check", help="train each policy of TRAIN here, then both halves (this venv)")
    both.add_argument("--lerobot-python", required=True, help="the Python of a venv with lerobot==0.6.1")
    both.add_argument("--atol", type=float, default=1e-5)
    back = sub.add_parser("main-resume", help="LeRobot main resumes a step of ours (this venv)")
    back.add_argument("--lerobot-main-python", required=True, help="the Python of LeRobot main's venv")
    args = parser.parse_args()
    if args.side == "main-resume":
        return lerobot_main_resume.check(os.path.abspath(args.lerobot_main_python))
    if args.side == "check":
        return check(os.path.abspath(args.lerobot_python), args.atol)  # the halves run elsewhere
    if args.side == "ours":
        ours(args.path, args.workdir, args.batch, args.embodiment)
        return 0
    return lerobot(args.workdir, args.atol)


if __name__ == "__main__":
    sys.exit(main())
