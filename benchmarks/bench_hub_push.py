"""What `--save_checkpoint_to_hub` costs the training loop: a run that saves often, pushing each checkpoint
to the loopback Hub (tests/helpers/hub_server.py, the real huggingface_hub client over 127.0.0.1),
against the same run without pushes, alternated, in one process (the MLP policy, about `--size-mb` of
weights); and what pushing in the loop would have cost instead: one synchronous `publish_model` of a
step, times the saves. The Hub is also run slowed (`--slow-s` per uploaded file, a slow link), where a
push outlasts the save interval and newer steps replace waiting ones. Figures are ratios to the run
without pushes. Run through `nox -s bench`.

Usage: python benchmarks/bench_hub_push.py [--size-mb 40] [--steps 40] [--save-freq 5] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # the loopback Hub double
os.environ["HF_HUB_DISABLE_XET"] = "1"  # before huggingface_hub is imported: plain HTTP + LFS
os.environ["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", "1")
BATCH = 32


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=40)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--save-freq", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--slow-s", type=float, default=1.0)
    args = parser.parse_args()

    from huggingface_hub.utils import disable_progress_bars

    from helpers.hub_server import HubServer

    disable_progress_bars()
    hidden = 1024
    blocks = max(1, args.size_mb * 2**20 // (4 * hidden * hidden))
    with tempfile.TemporaryDirectory() as workdir, HubServer() as hub:
        os.environ["HF_ENDPOINT"], os.environ["HF_TOKEN"] = hub.url, "hf_benchLOOPBACKtoken000000000"
        run = _runner(Path(workdir), hidden, blocks, args.steps, args.save_freq)
        run("warm-up", _push_flags("acme/warm-up"))  # imports, the Hub client's first connection
        runs: dict[str, list[tuple[float, float]]] = {"no pushes": [], "pushes": [], "pushes, slow Hub": []}
        for round_ in range(args.repeat):
            hub.slow("lfs_upload", 0.0)
            runs["no pushes"].append(run(f"plain-{round_}", []))
            runs["pushes"].append(run(f"push-{round_}", _push_flags(f"acme/bench-{round_}")))
            hub.slow("lfs_upload", args.slow_s)
            runs["pushes, slow Hub"].append(run(f"slow-{round_}", _push_flags(f"acme/slow-{round_}")))
        hub.slow("lfs_upload", 0.0)
        publish = _one_publish_seconds(Path(workdir) / "plain-0")
    saves = args.steps // args.save_freq
    step_base = median(step for step, _ in runs["no pushes"])
    wall_base = median(wall for _, wall in runs["no pushes"])
    mb = blocks * hidden * hidden * 4 / 2**20
    print(
        f"--save_checkpoint_to_hub, {mb:.0f} MB of weights, {args.steps} steps, a save every "
        f"{args.save_freq}, slow Hub {args.slow_s:.1f} s per uploaded file (median of {args.repeat}, "
        f"load {os.getloadavg()[0]:.1f}):"
    )
    print(f"{'run':32s} {'step ms':>8s} {'ratio':>6s} {'run s':>7s} {'ratio':>6s}")
    for name, values in runs.items():
        step, wall = median(v[0] for v in values), median(v[1] for v in values)
        print(f"{name:32s} {step * 1e3:8.1f} {step / step_base:6.3f} {wall:7.2f} {wall / wall_base:6.3f}")
    in_loop = wall_base + saves * publish
    print(
        f"{'a push per save, in the loop':32s} {'':8s} {'':6s} {in_loop:7.2f} {in_loop / wall_base:6.3f}"
        f"   ({saves} x {publish:.2f} s, one synchronous publish_model)"
    )
    print("step ms: median loop step of the log windows after the first (saves included); run s: the")
    print("whole train() call, with the end's wait for the last push.")


def _push_flags(repo: str) -> list[str]:
    return ["--save_checkpoint_to_hub=true", f"--policy.repo_id={repo}"]


def _runner(workdir: Path, hidden: int, blocks: int, steps: int, save_freq: int):
    """A function running `trainer train` in this process; it returns the median seconds per loop step
    (from metrics.jsonl) and the wall time of the whole run."""
    from accelerate.state import AcceleratorState

    from trainer.cli.parse import parse_config
    from trainer.engine.plan import train

    def run(name: str, extra: list[str]) -> tuple[float, float]:
        config = parse_config(
            [
                f"--output_dir={workdir / name}",
                f"--dataset.cache_dir={workdir / 'cache'}",
                "--dataset.eval_episodes=0",
                "--policy.type=mlp",
                f"--policy.hidden_dim={hidden}",
                f"--policy.blocks={blocks}",
                f"--batch_size={BATCH}",
                f"--steps={steps}",
                f"--save_freq={save_freq}",
                f"--log_freq={save_freq}",
                "--checkpoint_manifest=false",
                *extra,
            ]
        )
        AcceleratorState._reset_state(reset_partial_state=True)
        start = time.perf_counter()
        train(config)
        wall = time.perf_counter() - start
        lines = (workdir / name / "metrics.jsonl").read_text().splitlines()
        rates = [r["samples_per_s"] for r in map(json.loads, lines) if "samples_per_s" in r]
        return median(BATCH / rate for rate in rates[1:]), wall

    return run


def _one_publish_seconds(run_dir: Path) -> float:
    """One synchronous publish of the run's last step to a new repo: what the loop would wait per save."""
    import ckpt_tools

    step_dir = ckpt_tools.latest_step_dir(str(run_dir))
    start = time.perf_counter()
    ckpt_tools.publish_model(step_dir, "acme/bench-sync", endpoint=os.environ["HF_ENDPOINT"])
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
