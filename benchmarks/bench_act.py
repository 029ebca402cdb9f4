"""ACT benchmark: LeRobot's ACT with two 96x96 cameras, `trainer train` against a bare FSDP2 loop, and
the peak memory of a frozen against a trained ResNet-18 trunk (2 gloo ranks, CPU). The step-time figure
is a ratio to a baseline measured in the same run, the two sides alternated, so a loaded machine slows
both alike.

1. Step time: `trainer train --policy.type=act` (FSDP2 over 2 ranks, the dataset plug-in of
   act_cameras.py) from its metrics (samples/s per log window, the first dropped as warm-up), against
   act_cameras.py's bare loop over the same policy, FSDP units, AdamW groups, clipping and batch.
2. Peak RSS per rank of the bare loop with the trunk trained and frozen (left out of autograd and the
   optimizer: no gradients or AdamW moments for its 11 M parameters).

Usage: python benchmarks/bench_act.py [--batch 4] [--steps 12] [--repeat 2] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from statistics import median

from bench_engine import torchrun

HERE = Path(__file__).parent
WORKER = HERE / "act_cameras.py"
TRAIN = HERE.parent / "tests" / "distributed" / "scripts" / "train_cli.py"


def bare(workdir: Path, mode: str, batch: int, steps: int, window: int) -> dict:
    output = torchrun(WORKER, str(workdir), mode, str(batch), str(steps), str(window))
    return json.loads(
        next(line for line in output.splitlines() if line.startswith("RESULT ")).removeprefix("RESULT ")
    )


def trainer_step_seconds(workdir: Path, batch: int, steps: int, window: int) -> float:
    from act_cameras import ACT_FLAGS

    out = workdir / "trainer-run"
    shutil.rmtree(out, ignore_errors=True)
    policy = [f"--policy.{k}={'null' if v is None else v}" for k, v in ACT_FLAGS.items()]
    torchrun(
        TRAIN, f"--output_dir={out}", "--policy.type=act", *policy, "--dataset.type=act_cameras:TwoCamerasConfig",
        "--parallelism.dp_shard=2", f"--batch_size={batch}", f"--steps={steps + window}", f"--log_freq={window}",
        f"--save_freq={10 * steps}", "--use_policy_training_preset=false", "--optimizer.lr=1e-4", "--policy.optimizer_lr_backbone=1e-4",
    )  # fmt: skip
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rates = [r["samples_per_s"] for r in records if r.get("event") == "train" and "samples_per_s" in r]
    return median(2 * batch / rate for rate in rates[1:])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=4, help="per rank")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-act-"))
    window = max(args.steps // 4, 1)
    try:
        plain, engine, frozen = [], [], []
        for _ in range(args.repeat):  # alternated, so load changes hit both sides
            plain.append(bare(workdir, "trained", args.batch, args.steps, window))
            engine.append(trainer_step_seconds(workdir, args.batch, args.steps, window))
            frozen.append(bare(workdir, "frozen", args.batch, args.steps, window))
        base, ours = median(r["step_s"] for r in plain), median(engine)
        print("| measure | trainer / frozen | bare loop / trained | ratio |")
        print("|---|---|---|---|")
        print(
            f"| step time, 2 cameras 96x96, batch {args.batch}/rank | {ours:.3f} s | {base:.3f} s | {ours / base:.3f} |"
        )
        peak_t = max(max(r["peak_rss_mb"]) for r in plain)
        peak_f = max(max(r["peak_rss_mb"]) for r in frozen)
        print(
            f"| peak RSS per rank, bare loop | frozen trunk {peak_f:.0f} MB | trained trunk {peak_t:.0f} MB | {peak_f / peak_t:.3f} |"
        )
        step_f = median(r["step_s"] for r in frozen)
        print(
            f"| step time, bare loop | frozen trunk {step_f:.3f} s | trained trunk {base:.3f} s | {step_f / base:.3f} |"
        )
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
