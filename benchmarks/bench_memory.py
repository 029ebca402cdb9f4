"""Memory benchmark: a large policy built on the meta device, trained and saved on 1, 2 and 4 gloo ranks.

act_state at a large configuration (16 encoder + 16 decoder blocks of width 1024, feed-forward 4096:
~470 M parameters, each block an FSDP unit), fp32 AdamW, one step and one `--checkpoint_format=safetensors`
save (gathered tensor by tensor under FSDP2), on each layout (N ranks of FSDP2, or RxS: HSDP with R
replicas of S shards), then the same run started from that checkpoint with
`--policy.path` (weights streamed into the shards). memory_worker.py records each rank's VmHWM at the
end of the build (and load), of the first step, and of the run (after the save).

The ideal per rank is 16 bytes per parameter (fp32 weights, gradients, Adam's two moments) / N plus a
tiny run's peak on the same number of ranks (the interpreter, torch, gloo, the dataset); the sum over
ranks adds the ranks' peaks (an upper bound of the peak of their sum). Under HSDP the state is
sharded over S ranks only, so its ideal divides by S. Goals (issue 32): per-rank peak
<= 1.15x the ideal, the sum never N full copies, time to the first step not growing with N.

`--policy smolvla` measures LeRobot's SmolVLA at its default size instead (SmolVLM2-500M's published
sizes, random weights: 100 M parameters trained, 350 M frozen) on the embedded camera task with its
instruction, on 4 ranks; its ideal counts 4 bytes per frozen parameter (weights only) and its baseline
is a tiny SmolVLA's run (transformers is part of the runtime).

Usage: python benchmarks/bench_memory.py [--policy act_state|smolvla] [--layouts 1,2,4,2x2]
       [--blocks 16] [--dim 1024] [--ffn 4096] [--workdir DIR]
Each large configuration runs once, one at a time (at 470 M parameters a rank of the 1-process run
peaks near 8 GB; check `free -g` first).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench_engine import torchrun

from trainer.config.policy import PolicyConfig

HERE = Path(__file__).parent
sys.path.insert(
    0, str(HERE.parent / "tests")
)  # the suite's SmolVLM2-500M backbone, shared rather than copied
WORKER = HERE / "memory_worker.py"
GB = 1e9
PHASES = ("built", "first_step", "end")


def run(nproc: int, out: Path, flags: list[str]) -> list[dict[str, float]]:
    """One `trainer train` on `nproc` gloo ranks; each rank's record."""
    out.mkdir(parents=True, exist_ok=True)
    torchrun(WORKER, str(out), *flags, nproc=nproc)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]


def layout_flags(layout: str) -> tuple[int, int, list[str]]:
    """`N` (FSDP2 over N ranks; 1: a single process) or `RxS` (HSDP): the process count, the degree
    the state is sharded over, and the flags."""
    replicas, _, shards = layout.rpartition("x")
    replicate, shard = int(replicas or 1), int(shards)
    flags = [f"--parallelism.dp_shard={shard}"] if shard > 1 else []
    flags += [f"--parallelism.dp_replicate={replicate}"] if replicate > 1 else []
    return replicate * shard, shard, flags


def train_flags(output_dir: Path, cache: Path, layout: str, policy: list[str]) -> list[str]:
    shard = layout_flags(layout)[2]
    return [
        f"--output_dir={output_dir}",
        f"--dataset.cache_dir={cache}",
        "--dataset.episodes=4",
        "--dataset.eval_episodes=0",
        "--steps=1",
        "--save_freq=1",
        "--log_freq=1",
        "--checkpoint_format=safetensors",
        *shard,
        *policy,
    ]


@dataclass
class Subject:
    """A policy measured: the run's flags (batch, data), the policy's at the large size and at a tiny one
    (the baseline: the runtime the policy brings, from the interpreter to its libraries), and its
    trainable and frozen parameters."""

    title: str
    run: list[str]
    large: list[str]
    tiny: list[str]
    trainable: int
    frozen: int

    def ideal(self, shards: int, baseline: float) -> float:
        """Adam's 16 B per trainable parameter and 4 B per frozen one, over the shard degree."""
        return (16 * self.trainable + 4 * self.frozen) / shards + baseline

    def ideal_terms(self, shards: int, baseline: float) -> str:
        frozen = f" + 4 B x {self.frozen / 1e6:.0f} M" if self.frozen else ""
        return f"(16 B x {self.trainable / 1e6:.0f} M{frozen}) / {shards} + {baseline / GB:.2f}"


def counts(policy: PolicyConfig) -> tuple[int, int]:
    """Trainable and frozen parameters, from a meta build (no memory)."""
    import torch

    from trainer.policies import build_policy

    with torch.device("meta"):
        params = list(build_policy(policy, 3, 1).parameters())
    trainable = sum(p.numel() for p in params if p.requires_grad)
    return trainable, sum(p.numel() for p in params) - trainable


def act_state(blocks: int, dim: int, ffn: int) -> Subject:
    from trainer.policies.act_state import ACTStateConfig

    base = ["--policy.type=act_state", "--policy.dropout=0"]
    large = [f"--policy.dim={dim}", "--policy.heads=16", f"--policy.ffn_dim={ffn}"]
    large += [f"--policy.encoder_layers={blocks}", f"--policy.decoder_layers={blocks}"]
    config = ACTStateConfig(dim=dim, heads=16, ffn_dim=ffn, encoder_layers=blocks, decoder_layers=blocks)
    title = f"act_state {blocks}+{blocks} blocks of width {dim}"
    return Subject(title, ["--batch_size=8"], [*base, *large], base, *counts(config))


def smolvla(work: Path) -> Subject:
    """LeRobot's defaults on SmolVLM2-500M's sizes (random weights), on the embedded camera task."""
    from helpers.smolvlm_sizes import TINY_BACKBONE, write_smolvlm2_500m
    from trainer.policies.smolvla import SmolVLAConfig

    backbone = write_smolvlm2_500m(work / "smolvlm2_500m")
    tiny = ["--policy.type=smolvla", f"--policy.vlm_model_name={TINY_BACKBONE}", "--policy.num_vlm_layers=4"]
    tiny += ["--policy.resize_imgs_with_padding=[32,32]"]  # the tiny tower's image size (patch 4)
    features = ["observation.state", "observation.images.top", "task"]
    config = SmolVLAConfig(vlm_model_name=str(backbone), input_features=features)
    large = ["--policy.type=smolvla", f"--policy.vlm_model_name={backbone}"]
    title = "SmolVLA, LeRobot's defaults on SmolVLM2-500M"
    return Subject(title, ["--dataset.camera=true", "--batch_size=2"], large, tiny, *counts(config))


def row(layout: str, start: str, records: list[dict[str, float]], subject: Subject, baseline: float) -> str:
    """One table row: the largest rank's peak per phase, its ratio to the ideal, the ranks' sum."""
    shards = layout_flags(layout)[1]
    ideal = subject.ideal(shards, baseline)
    built, first, end = (max(r[phase] for r in records) / GB for phase in PHASES)
    total = sum(r["end"] for r in records) / GB
    first_step_s = max(r["first_step_s"] for r in records)
    return (
        f"| {layout} | {start} | {built:.2f} / {first:.2f} / {end:.2f} | {ideal / GB:.2f} "
        f"{subject.ideal_terms(shards, baseline)} | {end * GB / ideal:.2f}x "
        f"| {total:.2f} | {first_step_s:.0f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--layouts", default=None, help="N: FSDP2 over N ranks; RxS: HSDP (default 1,2,4,2x2; smolvla: 4)"
    )
    parser.add_argument("--policy", choices=("act_state", "smolvla"), default="act_state")
    parser.add_argument("--blocks", type=int, default=16)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--ffn", type=int, default=4096)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-memory-"))
    cache = work / "cache"
    subject = smolvla(work) if args.policy == "smolvla" else act_state(args.blocks, args.dim, args.ffn)
    frozen = f" + {subject.frozen / 1e6:.0f} M frozen" if subject.frozen else ""
    print(f"{subject.title}: {subject.trainable / 1e6:.0f} M parameters trained{frozen}")
    print(
        "\n| layout | start | per-rank peak: built / first step / after save (GB) | ideal per rank (GB) "
        "| ratio | sum over ranks (GB) | time to first step (s) |"
    )
    print("|---|---|---|---|---|---|---|", flush=True)
    layouts = args.layouts or ("4" if args.policy == "smolvla" else "1,2,4,2x2")
    for layout in layouts.split(","):
        nproc = layout_flags(layout)[0]
        tiny_dir = work / f"tiny{layout}"
        tiny = run(
            nproc, tiny_dir / "rec", train_flags(tiny_dir, cache, layout, [*subject.run, *subject.tiny])
        )
        baseline = max(r["end"] for r in tiny)
        fresh_dir, loaded_dir = work / f"large{layout}", work / f"loaded{layout}"
        fresh = run(
            nproc, fresh_dir / "rec", train_flags(fresh_dir, cache, layout, [*subject.run, *subject.large])
        )
        print(row(layout, "fresh", fresh, subject, baseline), flush=True)
        step = fresh_dir / "checkpoints" / "000001"
        from_step = [*subject.run, f"--policy.path={step}"]
        loaded = run(nproc, loaded_dir / "rec", train_flags(loaded_dir, cache, layout, from_step))
        print(row(layout, "--policy.path", loaded, subject, baseline), flush=True)
        shutil.rmtree(fresh_dir / "checkpoints")
        shutil.rmtree(loaded_dir / "checkpoints")
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
