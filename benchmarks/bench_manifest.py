"""What the integrity manifest costs a save: `save_checkpoint` with the manifest (sizes + sha256
hashed from the bytes as they are written) against `manifest=False`, and what `ckpt verify --deep`
costs against plain `verify`.

Each save runs in its own child process (one process, no process group) on a model of --size-mb fp32
weights; wall time and the child's peak RSS are reported as ratios to the run without a manifest.
With the manifest, the gathered model.safetensors is serialized once in memory so its bytes can be
hashed on their way out: the peak-RSS ratio shows that copy. Run through `nox -s bench`.

Usage: python benchmarks/bench_manifest.py [--size-mb 400] [--repeat 2]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def child(manifest: bool, size_mb: int, out: str) -> None:
    """Build the model, save one step, print `seconds peak_rss_mb` of the save."""
    import torch

    import ckpt_tools

    width = 1024
    layers = max(1, size_mb * 1024 * 1024 // (4 * width * width))
    model = torch.nn.Sequential(*(torch.nn.Linear(width, width, bias=False) for _ in range(layers)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    step = ckpt_tools.TrainingStep(
        step=1,
        dp_world_size=1,
        batch_size=1,
        grad_accum_steps=1,
        mixed_precision="no",
        checkpoint_format="safetensors",
        topology=ckpt_tools.training.Topology(),
        sampler=ckpt_tools.training.SamplerPosition(epoch=0, offset=0),
    )
    start = time.perf_counter()
    ckpt_tools.training.save_checkpoint(
        ckpt_tools.training.SaveRequest(
            checkpoints_dir=out,
            training_step=step,
            model=model,
            optimizer=optimizer,
            policy_config={},
            train_config={},
            manifest=manifest,
        )
    )
    seconds = time.perf_counter() - start
    print(seconds, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def measure(command: list[str]) -> tuple[float, float]:
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    seconds, rss = result.stdout.split()[-2:]
    return float(seconds), float(rss)


def timed(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, capture_output=True, check=False)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mb", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--child", choices=["on", "off"])
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.child:
        child(args.child == "on", args.size_mb, args.out)
        return
    ckpt = str(Path(sys.executable).parent / "ckpt")
    rows: dict[str, list[tuple[float, float]]] = {"off": [], "on": []}
    verify: dict[str, list[float]] = {"verify": [], "verify --deep": []}
    with tempfile.TemporaryDirectory() as work:
        for attempt in range(args.repeat):
            for mode in ("off", "on"):
                out = os.path.join(work, f"{mode}{attempt}")
                cmd = [
                    sys.executable,
                    __file__,
                    "--child",
                    mode,
                    "--size-mb",
                    str(args.size_mb),
                    "--out",
                    out,
                ]
                rows[mode].append(measure(cmd))
            step = os.path.join(work, f"on{attempt}", "000001")
            verify["verify"].append(timed([ckpt, "verify", step]))
            verify["verify --deep"].append(timed([ckpt, "verify", step, "--deep"]))
    base_s = min(s for s, _ in rows["off"])
    base_rss = min(r for _, r in rows["off"])
    print(f"save of {args.size_mb} MB fp32 weights, best of {args.repeat}")
    print(f"{'save':<24}{'seconds':>10}{'ratio':>8}{'peak RSS MB':>14}{'ratio':>8}")
    for mode, label in (("off", "manifest=False"), ("on", "manifest (default)")):
        seconds = min(s for s, _ in rows[mode])
        rss = min(r for _, r in rows[mode])
        print(f"{label:<24}{seconds:>10.2f}{seconds / base_s:>8.2f}{rss:>14.0f}{rss / base_rss:>8.2f}")
    base_v = min(verify["verify"])
    for label, times in verify.items():
        print(f"{label:<24}{min(times):>10.2f}{min(times) / base_v:>8.2f}   (whole command)")


if __name__ == "__main__":
    main()
