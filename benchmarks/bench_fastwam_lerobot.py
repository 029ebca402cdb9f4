"""Training step time of our FastWAM against LeRobot 0.6.1's own, in one process, step by step.

Both policies live in one worker process of LeRobot's venv (its torch; this project's sources on
PYTHONPATH), each loaded by its own code from the same checkpoint: LeRobot's tiny FastWAM
(`tests/fixtures/lerobot_fastwam_tiny`, 72 K trainable parameters, its frozen `tiny_wan/` and its launcher
`tiny_fastwam.py` pointing LeRobot's VAE there) or, with `--size mid`, the same checkpoint at MID's
widths (about 26 M trainable parameters), built by LeRobot's own `FastWAMPolicy` with its random
initialization and saved. Both train on the fixture's batch (its two preprocessed samples, tiled to
`--batch`) with the fixture's noises and timesteps: ours takes them as `forward(noise=, time=)`,
LeRobot's draws them itself, so its two schedulers' `sample_training_t` and, during its forward,
`torch.randn_like` return them (the fixture's README: the protocol its reference was made with).

A step is forward, backward, gradient clipping at 10 and AdamW at FastWAM's preset (lr 1e-4, weight
decay 1e-2), float32, on `--threads` torch threads (default 1: other jobs on a shared machine make 2
threads swing). The sides alternate step by step, each step's order swapped (A/B, B/A, ...), so a load
that comes and goes slows both alike; each side's figure is the median of its `--steps` timed steps
after `--warmup`, over `--repeat` fresh worker processes. The ratio is ours / LeRobot's (goal <= 1.0x);
the median of the per-pair ratios is printed beside it. Both sides' first-step losses (and their video
and action parts) are printed: the same weights, batch and draws give the same loss.

Ours keeps each prompt's UMT5 embeddings after its first step (docs/fastwam.md); LeRobot encodes the
prompt in every forward. The fixture's UMT5 is tiny, so that saves little here.

`nox -s lerobot_side` runs it when LEROBOT_PYTHON names a venv with `lerobot==0.6.1`; never part of the
tests or `nox -s bench`.

Usage:
  python benchmarks/bench_fastwam_lerobot.py --lerobot-python /path/to/lerobot-venv/bin/python \
    [--size fixture|mid|both] [--batch 2] [--steps 20] [--warmup 4] [--repeat 3] [--threads 1]
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "lerobot_fastwam_tiny"
SOURCES = (ROOT / "packages" / "ckpt-tools" / "src", ROOT / "packages" / "trainer" / "src")
COPIED = ("pretrained_model", "tiny_wan", "tiny_fastwam.py", "reference.safetensors", "reference.json")
MODEL_DIR = "pretrained_model"
CAMERA = "observation.images.front"
# `--size mid`: the experts' widths LeRobot's classes are built at (the rest is the fixture's: its
# frames, image size, action and state widths, and the tiny UMT5's 16-wide text)
MID = {
    "video_dit_config": {"hidden_dim": 512, "ffn_dim": 2048, "num_heads": 4, "attn_head_dim": 128, "num_layers": 4},
    "action_dit_config": {"hidden_dim": 256, "ffn_dim": 1024, "num_heads": 4, "attn_head_dim": 128, "num_layers": 4},
}  # fmt: skip


def prepare(workdir: Path, size: str, lerobot_python: str) -> None:
    """The fixture's files in `workdir`; at `mid` size, LeRobot's policy built at MID's widths and saved
    over the fixture's weights."""
    for name in COPIED:
        source = FIXTURE / name
        (shutil.copytree if source.is_dir() else shutil.copy)(source, workdir / name)
    if size == "mid":
        config_path = workdir / MODEL_DIR / "config.json"
        config = json.loads(config_path.read_text())
        for key, widths in MID.items():
            config[key] = {**config[key], **widths}
        config_path.write_text(json.dumps(config, indent=4))
        print(run_in(lerobot_python, workdir, ["build-mid"], threads=1).strip())


def run_in(python: str, workdir: Path, arguments: list[str], threads: int) -> str:
    """This script's `arguments` run by `python` in `workdir` (offline, our sources importable); its
    stdout."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([*map(str, SOURCES), str(workdir)]),
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "HF_HUB_OFFLINE": "1",
    }
    command = [python, str(Path(__file__).resolve()), *arguments]
    done = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode:
        sys.exit(f"{' '.join(arguments[:1])} in {python} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def build_mid() -> None:
    """LeRobot's venv, in the work directory: its FastWAM built from the edited config.json (its random
    initialization, seed 0), its weights saved as the checkpoint's."""
    import tiny_fastwam  # noqa: F401  (LeRobot's hard-coded VAE repo -> ./tiny_wan)
    import torch
    from lerobot.policies.fastwam.configuration_fastwam import FastWAMConfig
    from lerobot.policies.fastwam.modeling_fastwam import FastWAMPolicy

    torch.manual_seed(0)
    policy = FastWAMPolicy(FastWAMConfig.from_pretrained(MODEL_DIR))
    with tempfile.TemporaryDirectory() as saved:
        policy.save_pretrained(saved)
        shutil.copy(Path(saved) / "model.safetensors", Path(MODEL_DIR) / "model.safetensors")
    trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    print(f"LeRobot built the mid-sized FastWAM: {trainable:,} trainable parameters")


def training_batch(batch_size: int) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The fixture's preprocessed batch (the camera in [0, 1] from its raw frames), its noises and its
    timesteps, the two samples tiled to `batch_size`."""
    import torch
    from safetensors.torch import load_file

    reference = load_file("reference.safetensors")
    tasks = json.loads(Path("reference.json").read_text())["task"]
    rows = torch.arange(batch_size) % len(tasks)
    batch: dict[str, Any] = {
        k.removeprefix("pre."): v[rows] for k, v in reference.items() if k.startswith("pre.")
    }
    batch[CAMERA] = reference[f"raw.{CAMERA}.uint8"][rows].float() / 255
    batch["task"] = [tasks[i] for i in rows.tolist()]
    noise = {part: reference[f"loss.noise_{part}"][rows] for part in ("video", "action")}
    times = {part: reference[f"loss.timestep_{part}"][rows] for part in ("video", "action")}
    return batch, noise, times


class Side:
    """One policy, its optimizer and how it runs the fixed-draw forward."""

    def __init__(self, name: str, policy: Any, forward: Callable[[], Any]) -> None:
        import torch

        self.name, self.policy, self.forward = name, policy, forward
        self.params = [p for p in policy.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.params, lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2
        )
        self.times: list[float] = []
        self.first: dict[str, float] = {}
        policy.train()

    def step(self, timed: bool) -> None:
        import torch

        start = time.perf_counter()
        loss, parts = self.forward()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 10.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        elapsed = time.perf_counter() - start
        if not self.first:
            self.first = {"loss": loss.item(), **{k: float(v) for k, v in parts.items()}}
        if timed:
            self.times.append(elapsed)


def ours(batch: dict[str, Any], noise: dict[str, Any], times: dict[str, Any]) -> Side:
    import trainer

    policy = trainer.load_policy(MODEL_DIR).policy
    return Side("ours", policy, lambda: policy.forward(dict(batch), noise=noise, time=times))


def lerobot(batch: dict[str, Any], noise: dict[str, Any], times: dict[str, Any]) -> Side:
    """LeRobot's policy, its schedulers' timesteps and its two noise draws fixed to the fixture's."""
    import tiny_fastwam  # noqa: F401  (LeRobot's hard-coded VAE repo -> ./tiny_wan)
    from lerobot.policies.fastwam.modeling_fastwam import FastWAMPolicy

    policy = FastWAMPolicy.from_pretrained(MODEL_DIR, strict=True)
    model = policy.model
    model.train_video_scheduler.sample_training_t = lambda **kw: times["video"].to(kw["dtype"])
    model.train_action_scheduler.sample_training_t = lambda **kw: times["action"].to(kw["dtype"])

    def forward() -> Any:
        with drawing(noise["video"], noise["action"]):
            return policy.forward(dict(batch))

    return Side("lerobot", policy, forward)


@contextlib.contextmanager
def drawing(*draws: Any) -> Iterator[None]:
    """`torch.randn_like` returns `draws` in order (each of its argument's shape), all of them."""
    import torch

    queue, original = list(draws), torch.randn_like

    def fixed(like: Any, **_: Any) -> Any:
        draw = queue.pop(0)
        assert draw.shape == like.shape, f"draw {tuple(draw.shape)} for {tuple(like.shape)}"
        return draw.to(like)

    torch.randn_like = fixed
    try:
        yield
    finally:
        torch.randn_like = original
    assert not queue, f"LeRobot's forward drew {len(draws) - len(queue)} noises, not {len(draws)}"


def worker(batch_size: int, steps: int, warmup: int) -> dict[str, Any]:
    """Both sides' steps alternated, the order swapped every step; each side's step times and first
    losses."""
    import torch

    batch, noise, times = training_batch(batch_size)
    sides = [ours(batch, noise, times), lerobot(batch, noise, times)]
    for i in range(warmup + steps):
        for side in sides if i % 2 == 0 else sides[::-1]:
            side.step(timed=i >= warmup)
    return {
        side.name: {
            "times": side.times,
            "first": side.first,
            "trainable": sum(p.numel() for p in side.params),
        }
        for side in sides
    } | {"torch": torch.__version__}


def report(size: str, runs: list[dict[str, Any]], args: argparse.Namespace) -> float:
    """The table's row of one size; returns the ratio."""
    times = {side: [t for run in runs for t in run[side]["times"]] for side in ("ours", "lerobot")}
    median = {side: statistics.median(values) for side, values in times.items()}
    pairs = statistics.median(o / le for o, le in zip(times["ours"], times["lerobot"], strict=True))
    ratio = median["ours"] / median["lerobot"]
    print(
        f"{size} ({runs[0]['ours']['trainable']:,} trainable), batch {args.batch}, {args.threads} thread(s), "
        f"torch {runs[0]['torch']}, {args.steps} steps after {args.warmup} alternated x {args.repeat} processes "
        f"(forward + backward + clip + AdamW), medians:"
    )
    for side in ("ours", "lerobot"):
        first = runs[0][side]["first"]
        parts = ", ".join(f"{k} {v:.7f}" for k, v in first.items() if k != "loss")
        print(f"  {side:8s} {1000 * median[side]:8.1f} ms/step  first loss {first['loss']:.7f} ({parts})")
    print(f"  ratio ours / LeRobot: {ratio:.2f}x (median of per-step pairs {pairs:.2f}x; goal <= 1.0x)")
    return ratio


def drive(args: argparse.Namespace) -> int:
    lerobot_python = os.path.abspath(args.lerobot_python)  # not resolve(): a venv's python is a link
    sizes = ("fixture", "mid") if args.size == "both" else (args.size,)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for size in sizes:
        with tempfile.TemporaryDirectory(prefix="bench_fastwam_") as tmp:
            workdir = Path(tmp)
            prepare(workdir, size, lerobot_python)
            command = ["worker", f"--batch={args.batch}", f"--steps={args.steps}", f"--warmup={args.warmup}"]
            runs = []
            for _ in range(args.repeat):
                out = run_in(lerobot_python, workdir, [*command, f"--threads={args.threads}"], args.threads)
                line = next(line for line in out.splitlines() if line.startswith("RESULT "))
                runs.append(json.loads(line.removeprefix("RESULT ")))
        report(size, runs, args)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "mode", nargs="?", choices=("worker", "build-mid"), help="internal: in LeRobot's venv"
    )
    parser.add_argument("--lerobot-python", help="the Python of a venv with lerobot==0.6.1")
    parser.add_argument("--size", choices=("fixture", "mid", "both"), default="both")
    parser.add_argument("--batch", type=int, default=2, help="the fixture's 2 samples tiled to this many")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3, help="fresh worker processes per size")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if args.mode == "build-mid":
        build_mid()
        return 0
    if args.mode == "worker":
        import torch

        torch.set_num_threads(args.threads)
        print("RESULT " + json.dumps(worker(args.batch, args.steps, args.warmup)))
        return 0
    if not args.lerobot_python:
        parser.error("--lerobot-python is required: the Python of a venv with lerobot==0.6.1")
    if min(args.batch, args.steps, args.repeat, args.threads) < 1 or args.warmup < 0:
        parser.error("--batch, --steps, --repeat and --threads must be >= 1, --warmup >= 0")
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
