"""Training step time of our SmolVLA (or ACT, Diffusion Policy, pi0.5) against LeRobot 0.6.1's, side by
side on CPU. Two venvs.

Both sides load the same LeRobot checkpoint (`tests/fixtures/lerobot_smolvla_tiny`, LeRobot's tiny
SmolVLA; with `--policy act` the committed LeRobot ACT, `tests/fixtures/lerobot/checkpoint_act`; with
`--policy diffusion` LeRobot's Diffusion Policy, `tests/fixtures/lerobot_diffusion_tiny`: two 24x40
cameras resized to 48x80 and cropped to 43x72, one shared ResNet-18 with group norm, a U-Net of
[16, 32, 64]; with `--policy pi05` LeRobot's tiny pi0.5, `tests/fixtures/lerobot_pi05_tiny`: ours at its
sizes through `size_overrides`, LeRobot's through the fixture's own `tiny_pi.py`) with their own
`from_pretrained`, read the same preprocessed batch from one safetensors file (drawn here, seeded; the
VLAs' flow-matching noise and times included, so both compute the same loss: LeRobot's pi forward takes
neither, so its model's two samplers are replaced on the instance, as the fixture's reference was
computed; Diffusion's `n_obs_steps` observation history and `horizon` actions), and time the same step
from the same seed of torch's global generator (Diffusion's crops, noise and timesteps draw from it,
alike on both sides): `forward`, `backward`, gradient clipping at 10, AdamW over the parameters that
require gradients, `zero_grad`. Each worker runs `--warmup` steps, then `--steps` timed ones, on
`--threads` torch threads (default 1: on a shared 2-core machine, 2 OpenMP threads that lose a core to
another job made either side swing between 20 and 600 ms per step); the sides alternate `--repeat`
times, so a loaded machine slows both alike.
The figure is ours / LeRobot's, each side's best run (the median step of its least disturbed run: other
jobs only ever slow a run down), with the samples per second it means; the goal is <= 1.0x. The first
step's losses are printed too: for the VLAs and Diffusion Policy they agree to float rounding (the same
weights, batch and random draws).

This project's half runs in this venv (`trainer` importable); LeRobot's in a Python 3.12 venv with
`pip install "lerobot[smolvla]==0.6.1"` (this project not needed there), given as --lerobot-python.
The two venvs may hold different torch builds (this project pins torch 2.13 CPU; LeRobot 0.6.1 needs
torch < 2.12): `--ours-python` runs our side in LeRobot's venv too, with this project's sources on
PYTHONPATH, for a comparison on one torch.
With `--policy pi05 --size mid` both sides run a mid-sized pi0.5 instead of the fixture's tiny one:
LeRobot's own code builds it at the sizes in MID_PI05 (PaliGemma's language model 512 wide and 4 deep,
an expert 256 wide, a 4-layer SigLIP at 224 x 224, a 16,384-token vocabulary, chunks of 50: about 46 M
parameters) with its random initialization and saves it; both sides then load that file.
Never part of the tests or `nox -s bench`.

Usage:
  python benchmarks/bench_smolvla_lerobot.py --lerobot-python /path/to/lerobot-venv/bin/python \
    [--ours-python PYTHON] [--policy smolvla|act|diffusion|pi05] [--batch 8] [--steps 20] [--warmup 3] \
    [--repeat 3] [--threads 1] [--size fixture|mid]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from lerobot_side import seeded_inputs
from safetensors.torch import load_file, save_file

FIXTURES = Path(__file__).parents[1] / "tests" / "fixtures"
MODELS = {
    "smolvla": FIXTURES / "lerobot_smolvla_tiny" / "pretrained_model",
    "act": FIXTURES / "lerobot" / "checkpoint_act" / "checkpoints" / "000002" / "pretrained_model",
    "diffusion": FIXTURES / "lerobot_diffusion_tiny" / "pretrained_model",
    "pi05": FIXTURES / "lerobot_pi05_tiny" / "pretrained_model",
}
# LeRobot's pi0.5 fixture: its tokenizer (named relatively), and its launcher shrinking LeRobot's sizes
PI_FILES = (FIXTURES / "lerobot_pi05_tiny" / "tiny_paligemma", FIXTURES / "lerobot_pi05_tiny" / "tiny_pi.py")
OVERRIDES = "tiny_paligemma/tiny_pi_overrides.json"
BACKBONE = FIXTURES / "lerobot_smolvla_tiny" / "tiny_smolvlm"  # named relatively by the SmolVLA config
MODEL_DIR, BATCH = "pretrained_model", "batch.safetensors"
NOISE, TIME = "bench.noise", "bench.time"  # SmolVLA's flow-matching draws, passed to forward
TOKENS, TOKEN_MASK = "observation.language.tokens", "observation.language.attention_mask"
ENV = "observation.environment_state"
TASK = "pick up the red block"
# `--size mid`: the sizes LeRobot's pi0.5 is built at (the fixture's override format, applied to
# LeRobot's code by the fixture's tiny_pi.py and to ours by size_overrides), and its config.json edits
MID_PI05 = {
    "preset": "mid",
    "tokenizer": "tiny_paligemma",
    "vocab_size": 16384,
    "gemma_variants": {
        "gemma_2b": {
            "width": 512,
            "depth": 4,
            "mlp_dim": 2048,
            "num_heads": 8,
            "num_kv_heads": 1,
            "head_dim": 64,
        },
        "gemma_300m": {
            "width": 256,
            "depth": 4,
            "mlp_dim": 1024,
            "num_heads": 8,
            "num_kv_heads": 1,
            "head_dim": 64,
        },
    },
    "vision": {
        "hidden_size": 384,
        "intermediate_size": 1536,
        "num_hidden_layers": 4,
        "num_attention_heads": 6,
        "patch_size": 14,
    },
}
MID_PI05_CONFIG = {"image_resolution": [224, 224], "chunk_size": 50, "n_action_steps": 50}


def prepare(policy: str, workdir: Path, batch_size: int, mid_size_by: str | None = None) -> None:
    """The model directory and the batch both sides read (this project's venv); with `mid_size_by` (a
    LeRobot venv's Python), pi0.5 at MID_PI05's sizes, built and saved by LeRobot's code."""
    import trainer

    shutil.copytree(MODELS[policy], workdir / MODEL_DIR)
    if policy == "smolvla":
        shutil.copytree(BACKBONE, workdir / BACKBONE.name)
    if policy == "pi05":
        shutil.copytree(PI_FILES[0], workdir / PI_FILES[0].name)
        shutil.copy(PI_FILES[1], workdir / PI_FILES[1].name)
    if mid_size_by is not None:
        _lerobot_builds_mid_pi05(mid_size_by, workdir)
    config = json.loads((workdir / MODEL_DIR / "config.json").read_text())
    g = torch.Generator().manual_seed(0)
    batch = seeded_inputs(config, batch_size, g)
    if policy == "diffusion":  # every observation feature with its history (B, n_obs_steps, ...)
        draws = [batch, *(seeded_inputs(config, batch_size, g) for _ in range(config["n_obs_steps"] - 1))]
        batch = {key: torch.stack([draw[key] for draw in draws], dim=1) for key in batch}
    chunk = config["horizon"] if policy == "diffusion" else config["chunk_size"]
    action_dim = config["output_features"]["action"]["shape"][0]
    batch["action"] = torch.randn(batch_size, chunk, action_dim, generator=g)
    batch["action_is_pad"] = torch.zeros(batch_size, chunk, dtype=torch.bool)
    if policy in ("smolvla", "pi05"):
        with contextlib.chdir(workdir):  # where the config's relative backbone name resolves
            loaded = trainer.load_policy(MODEL_DIR, **_fields(policy))
        state = (batch["observation.state"],) if policy == "pi05" else ()  # pi0.5's prompt holds it
        batch[TOKENS], batch[TOKEN_MASK] = loaded.policy.tokenizer([TASK] * batch_size, *state)
        batch[NOISE] = torch.randn(batch_size, chunk, config["max_action_dim"], generator=g)
        batch[TIME] = torch.rand(batch_size, generator=g) * 0.999 + 0.001
    save_file(batch, str(workdir / BATCH), metadata={"type": policy})


def _lerobot_builds_mid_pi05(python: str, workdir: Path) -> None:
    """The fixture's pi0.5 at MID_PI05's sizes: its overrides and config.json edited, then LeRobot's
    `PI05Policy(config)` (its own random initialization, seed 0) saved over the fixture's weights."""
    (workdir / OVERRIDES).write_text(json.dumps(MID_PI05, indent=2))
    config_path = workdir / MODEL_DIR / "config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), **MID_PI05_CONFIG}, indent=2))
    command = [python, str(Path(__file__).resolve()), "build-mid", str(workdir)]
    done = subprocess.run(
        command, cwd=workdir, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True
    )
    if done.returncode:
        sys.exit(f"LeRobot could not build the mid-sized pi0.5:\n{done.stderr[-3000:]}")


def build_mid(workdir: Path) -> None:
    """LeRobot's venv: build pi0.5 from the edited config.json at the overridden sizes and save its
    weights (the work directory's model.safetensors)."""
    sys.path.insert(0, str(workdir))
    import tiny_pi  # noqa: F401  (MID_PI05's sizes, before LeRobot builds the policy)
    from lerobot.policies.pi05 import PI05Config, PI05Policy

    torch.manual_seed(0)
    policy = PI05Policy(PI05Config.from_pretrained(str(workdir / MODEL_DIR)))
    with tempfile.TemporaryDirectory() as saved:
        policy.save_pretrained(saved)
        shutil.copy(Path(saved) / "model.safetensors", workdir / MODEL_DIR / "model.safetensors")
    print(f"built pi0.5 with {sum(p.numel() for p in policy.parameters()):,} parameters")


def load_ours(policy: str, workdir: Path, batch: dict[str, torch.Tensor]) -> torch.nn.Module:
    """Our policy from LeRobot's checkpoint; our ACT reads the environment state as the last values of
    `observation.state` (--policy.env_state_dim), where LeRobot's reads its own key."""
    import trainer

    if policy == "act" and ENV in batch:
        batch["observation.state"] = torch.cat([batch["observation.state"], batch.pop(ENV)], dim=-1)
    return trainer.load_policy(str(workdir / MODEL_DIR), **_fields(policy)).policy


def _fields(policy: str) -> dict[str, str]:
    """What LeRobot's config.json does not record: the tiny pi0.5's sizes."""
    return {"size_overrides": OVERRIDES} if policy == "pi05" else {}


def load_lerobot(policy: str, workdir: Path) -> torch.nn.Module:
    if policy == "act":
        from lerobot.policies.act.modeling_act import ACTPolicy

        return ACTPolicy.from_pretrained(str(workdir / MODEL_DIR), strict=True)
    if policy == "pi05":
        sys.path.insert(0, str(workdir))
        import tiny_pi  # noqa: F401  (the fixture's sizes, before LeRobot builds the policy)
        from lerobot.policies.pi05 import PI05Policy

        return PI05Policy.from_pretrained(str(workdir / MODEL_DIR), strict=True)
    if policy == "diffusion":
        from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy

        return DiffusionPolicy.from_pretrained(str(workdir / MODEL_DIR), strict=True)
    from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy

    return SmolVLAPolicy.from_pretrained(str(workdir / MODEL_DIR), strict=True)


def worker(side: str, workdir: Path, steps: int, warmup: int) -> dict[str, Any]:
    """Time `steps` training steps after `warmup` on the saved batch; returns the median step time and
    the first step's loss."""
    batch = load_file(str(workdir / BATCH))
    from safetensors import safe_open

    with safe_open(str(workdir / BATCH), "pt") as handle:
        policy_type = (handle.metadata() or {})["type"]
    kwargs = {}
    if NOISE in batch:
        kwargs = {"noise": batch.pop(NOISE), "time": batch.pop(TIME)}
    policy = load_ours(policy_type, workdir, batch) if side == "ours" else load_lerobot(policy_type, workdir)
    policy.train()
    if side == "lerobot" and policy_type == "pi05":  # its forward takes no noise or time: fix its draws
        noise, flow_time = kwargs.pop("noise"), kwargs.pop("time")
        policy.model.sample_noise = lambda shape, device: noise
        policy.model.sample_time = lambda size, device: flow_time
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=1e-10)
    times, first_loss = [], float("nan")
    for i in range(warmup + steps):
        torch.manual_seed(i)  # Diffusion's crops, noise and timesteps: the same draws on both sides
        start = time.perf_counter()
        loss, _ = policy.forward(dict(batch), **kwargs)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 10.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        elapsed = time.perf_counter() - start
        if i == 0:
            first_loss = loss.item()
        if i >= warmup:
            times.append(elapsed)
    return {
        "step_s": statistics.median(times),
        "first_loss": first_loss,
        "trainable": sum(p.numel() for p in params),
        "torch": torch.__version__,
    }


def run_worker(python: str, side: str, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    threads = str(args.threads)
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "HF_HUB_OFFLINE": "1"}
    command = [python, str(Path(__file__).resolve()), "worker", side, str(workdir)]
    command += [f"--steps={args.steps}", f"--warmup={args.warmup}", f"--threads={threads}"]
    done = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode:
        sys.exit(f"the {side} worker failed:\n{done.stderr[-3000:]}")
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def drive(args: argparse.Namespace) -> int:
    # absolute: the workers run in the work directory (abspath, not resolve: a venv's python is a link)
    pythons = {
        side: os.path.abspath(python)
        for side, python in (("ours", args.ours_python or sys.executable), ("lerobot", args.lerobot_python))
    }
    with tempfile.TemporaryDirectory(prefix="bench_lerobot_") as tmp:
        workdir = Path(tmp)
        prepare(args.policy, workdir, args.batch, pythons["lerobot"] if args.size == "mid" else None)
        results: dict[str, list[dict[str, Any]]] = {"ours": [], "lerobot": []}
        for _ in range(args.repeat):
            for side, python in pythons.items():
                results[side].append(run_worker(python, side, workdir, args))
    step = {side: min(r["step_s"] for r in runs) for side, runs in results.items()}
    print(
        f"{args.policy} ({args.size} size), batch {args.batch}, {args.threads} threads, {args.steps} steps after {args.warmup} "
        f"warm-up, best of {args.repeat} alternated runs (forward + backward + clip + AdamW):"
    )
    for side, runs in results.items():
        each = ", ".join(f"{1000 * r['step_s']:.1f}" for r in runs)
        print(
            f"  {side:8s} {1000 * step[side]:8.1f} ms/step  (runs: {each} ms; first loss "
            f"{runs[0]['first_loss']:.7g}; {int(runs[0]['trainable']):,} trainable parameters; torch {runs[0]['torch']})"
        )
    rates = {side: args.batch / seconds for side, seconds in step.items()}
    print(f"  samples/s: ours {rates['ours']:.1f}, LeRobot {rates['lerobot']:.1f}")
    print(f"  ratio ours / LeRobot: {step['ours'] / step['lerobot']:.2f}x (goal <= 1.0x)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="mode")
    work = sub.add_parser("worker", help="one side's timed steps (internal)")
    work.add_argument("side", choices=("ours", "lerobot"))
    work.add_argument("workdir", type=Path)
    sub.add_parser("build-mid", help="LeRobot builds the mid-sized pi0.5 (internal)").add_argument(
        "workdir", type=Path
    )
    for p in (parser, work):
        p.add_argument("--steps", type=int, default=20)
        p.add_argument("--warmup", type=int, default=3)
        p.add_argument("--threads", type=int, default=1)
    parser.add_argument("--lerobot-python", help="the Python of a venv with lerobot==0.6.1")
    parser.add_argument(
        "--ours-python",
        help="run our side in another Python (default: this one), e.g. LeRobot's venv with this project's "
        "sources on PYTHONPATH, so that both sides run on the same torch build",
    )
    parser.add_argument("--policy", choices=tuple(MODELS), default="smolvla")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--size", choices=("fixture", "mid"), default="fixture", help="mid: pi0.5 at MID_PI05's sizes"
    )
    args = parser.parse_args()
    if args.mode == "build-mid":
        build_mid(args.workdir)
        return 0
    if args.mode == "worker":
        torch.set_num_threads(args.threads)
        print("RESULT " + json.dumps(worker(args.side, args.workdir, args.steps, args.warmup)))
        return 0
    if not args.lerobot_python:
        parser.error("--lerobot-python is required: the Python of a venv with lerobot==0.6.1")
    if args.size == "mid" and args.policy != "pi05":
        parser.error(f"--size mid is pi0.5's (--policy pi05), not {args.policy}'s")
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
