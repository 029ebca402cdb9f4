"""Engine benchmark: `trainer train` against a bare loop, a checkpoint save against a raw `dcp.save`,
and the host memory of a resume against a fresh start. Each figure is a ratio to a baseline measured
in the same run (2 gloo ranks, CPU), so a loaded machine slows both sides alike.

1. Steady-state step time: `trainer train` (FSDP2 over 2 ranks, the MLP policy) from its metrics
   (samples/s per log window, the first window dropped as warm-up), against engine_worker.py's bare
   loop with the same policy classes, FSDP2 wrap units, AdamW settings, gradient clipping and per-rank
   batch, timed the same way (windows of --log_freq steps, the first dropped, the median window) and
   drawing its batches from memory as the trainer does. Goal: within 3 %.
2. Training stall of a synchronous save: `ckpt_tools.training.save_checkpoint` (DCP model and optimizer, RNG,
   side files, commit), against a raw `dcp.save` of the same model and optimizer state dicts (taken
   at the call), after a warm-up round, at two sizes of state: the step-time model's and one of
   ~100 MB; the same save without its manifest is the like-for-like figure (a raw save hashes
   nothing), the difference is what the sha256 manifest costs. Goal: within 10 %.
3. Peak RSS per rank of a resume (fresh start = build the sharded model and take one step), loading
   gathered safetensors (each rank reads only its own rows), the same file read whole by every rank
   (how resumes read it before), DCP shards, and a DDP run's step (gathered weights and optimizer
   state, each rank reading only its own rows of both).

Usage: python benchmarks/bench_engine.py [--hidden 512] [--blocks 4] [--batch 128] [--steps 40]
       [--repeat 5] [--save-hidden 1024] [--save-blocks 8] [--save-rounds 20]
       [--resume-hidden 2048] [--resume-blocks 12] [--workdir DIR]
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
from statistics import median

HERE = Path(__file__).parent
WORKER = HERE / "engine_worker.py"
TRAIN = HERE.parent / "tests" / "distributed" / "scripts" / "train_cli.py"


def torchrun(script: Path, *args: str, nproc: int = 2) -> str:
    """Run `script` on `nproc` gloo ranks with benchmarks/ on the path (workers and dataset plug-ins live
    here), one torch thread each (BENCH_THREADS sets another count)."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": os.environ.get("BENCH_THREADS", "1"),  # per rank (a machine with cores to spare)
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--rdzv-endpoint=localhost:0"]
    result = subprocess.run(
        [*command, f"--nproc-per-node={nproc}", str(script), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    if result.returncode != 0:
        raise SystemExit(f"{script.name} {' '.join(args[:2])} failed:\n{result.stdout[-4000:]}")
    return result.stdout


def worker(*args: object) -> dict:
    output = torchrun(WORKER, *(str(a) for a in args))
    line = next(line for line in output.splitlines() if line.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def log_window(steps: int) -> int:
    """Steps per timed window, on both sides: the trainer's --log_freq."""
    return max(steps // 5, 1)


def trainer_step_seconds(workdir: Path, hidden: int, blocks: int, batch: int, steps: int) -> float:
    """Median seconds per loop step of `trainer train` over its log windows after the first."""
    out = workdir / "trainer-run"
    shutil.rmtree(out, ignore_errors=True)
    log_every = log_window(steps)
    torchrun(
        TRAIN,
        f"--output_dir={out}",
        f"--dataset.cache_dir={workdir / 'cache'}",
        "--policy.type=mlp",
        f"--policy.hidden_dim={hidden}",
        f"--policy.blocks={blocks}",
        "--parallelism.dp_shard=2",
        f"--batch_size={batch}",
        f"--steps={steps + log_every}",
        f"--log_freq={log_every}",
        f"--save_freq={10 * steps}",
        "--dataset.eval_episodes=0",
    )
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rates = [r["samples_per_s"] for r in records if r.get("event") == "train" and "samples_per_s" in r]
    return median(2 * batch / rate for rate in rates[1:])


def ratio_line(name: str, value: float, base: float, unit: str, goal: str) -> str:
    return f"| {name} | {value * 1e3:.1f} {unit} | {base * 1e3:.1f} {unit} | {value / base:.3f} | {goal} |"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--batch", type=int, default=128, help="per rank")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--save-hidden", type=int, default=1024)
    parser.add_argument("--save-blocks", type=int, default=8)
    parser.add_argument("--save-rounds", type=int, default=20)
    parser.add_argument("--resume-hidden", type=int, default=2048)
    parser.add_argument("--resume-blocks", type=int, default=12)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-engine-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        bare, engine = [], []
        window = log_window(args.steps)
        for repeat in range(args.repeat):  # alternated, so load changes hit both sides
            result = worker(
                "bare", workdir / f"bare{repeat}", args.hidden, args.blocks, args.batch, args.steps, window
            )
            bare.append(result["step_s"])
            engine.append(trainer_step_seconds(workdir, args.hidden, args.blocks, args.batch, args.steps))
        stalls = [
            worker("saves", workdir / "saves", hidden, blocks, args.save_rounds)
            for hidden, blocks in ((args.hidden, args.blocks), (args.save_hidden, args.save_blocks))
        ]

        sizes = (args.resume_hidden, args.resume_blocks)
        written = worker("write", workdir / "resume", *sizes)
        peaks = {mode: worker(mode, workdir / "resume", *sizes)["peak_rss_mib"] for mode in MODES}
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)

    print(
        f"engine: MLP policy hidden {args.hidden} x {args.blocks} blocks, FSDP2 over 2 gloo ranks (CPU), "
        f"batch {args.batch} per rank, medians of {args.repeat} alternated runs"
    )
    print("| measure | engine | baseline | ratio | goal |")
    print("|---|---|---|---|---|")
    print(ratio_line("step time: trainer train / bare loop", median(engine), median(bare), "ms", "<= 1.03"))
    for stall in stalls:
        size = f"{stall['state_bytes'] / 1e6:.0f} MB state"
        raw = stall["raw_save_s"]
        print(
            ratio_line(
                f"save stall, {size}: without manifest / raw dcp.save",
                stall["ckpt_save_no_manifest_s"],
                raw,
                "ms",
                "<= 1.10",
            )
        )
        print(
            ratio_line(
                f"save stall, {size}: with manifest (default) / raw dcp.save",
                stall["ckpt_save_s"],
                raw,
                "ms",
                "-",
            )
        )
    print()
    print(
        f"resume: model of {written['bytes'] / 1e6:.0f} MB fp32 (hidden {sizes[0]} x {sizes[1]} blocks), "
        "FSDP2 over 2 ranks, peak RSS per rank (MiB)"
    )
    fresh = max(peaks["fresh"])
    print("| start | rank 0 | rank 1 | max / fresh |")
    print("|---|---|---|---|")
    for mode, label in MODES.items():
        row = peaks[mode]
        print(f"| {label} | {row[0]:.0f} | {row[1]:.0f} | {max(row) / fresh:.2f} |")


MODES = {
    "fresh": "fresh start",
    "safetensors": "resume from model.safetensors (own rows)",
    "safetensors-full": "same file read whole per rank (before)",
    "dcp": "resume from DCP",
    "ddp": "a DDP run's step (optimizer_state.safetensors, own rows)",
}


if __name__ == "__main__":
    main()
