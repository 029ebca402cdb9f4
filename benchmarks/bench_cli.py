"""How long a metadata command takes to answer: `ckpt inspect --json` on a small LeRobot checkpoint
against huggingface_hub's `hf version` (a CLI of the same stack: typer, rich, huggingface_hub), a
bare Python start and a bare typer app with `ckpt inspect`'s signature (one str argument, two bool
options: the floor typer itself sets, as it builds a pydantic TypeAdapter for each non-bool
parameter), run alternately in fresh processes; medians, as ratios to `hf version`.

Commands register lazily (ckpt_tools/cli/commands.py): `ckpt inspect` imports inspect's modules only,
not conversion's, publishing's or diff's. Run through `nox -s bench`.

Usage: python benchmarks/bench_cli.py [--repeat 15]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHECKPOINT = HERE.parent / "tests" / "fixtures" / "lerobot" / "checkpoint_act" / "checkpoints" / "000004"
BARE_TYPER = """
import typer
app = typer.Typer(add_completion=False)
@app.command()
def inspect(path: str = typer.Argument(...), tensors: bool = typer.Option(False, "--tensors"),
            as_json: bool = typer.Option(False, "--json")) -> None:
    print("{}")
app()
"""


def _seconds(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def _tool(name: str) -> str:
    found = shutil.which(name, path=os.path.dirname(sys.executable)) or shutil.which(name)
    if found is None:
        raise SystemExit(f"{name} is not installed beside {sys.executable}")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    commands = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "hf version": [_tool("hf"), "version"],
        "bare typer (inspect's signature)": [sys.executable, "-c", BARE_TYPER, "--json", str(CHECKPOINT)],
        "ckpt --version": [_tool("ckpt"), "--version"],
        "ckpt inspect --json": [_tool("ckpt"), "inspect", "--json", str(CHECKPOINT)],
    }
    times: dict[str, list[float]] = {name: [] for name in commands}
    for command in commands.values():  # warm the page cache once
        _seconds(command)
    for round_ in range(args.repeat):
        order = list(commands.items())
        order = order[round_ % len(order) :] + order[: round_ % len(order)]  # rotate: no side always first
        for name, command in order:
            times[name].append(_seconds(command))
    baseline = statistics.median(times["hf version"])
    print(f"CLI start, median of {args.repeat} alternated runs (load {os.getloadavg()[0]:.1f}):")
    print(f"{'command':32s} {'seconds':>8s} {'/ hf version':>13s}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:32s} {median:8.3f} {median / baseline:13.2f}")


if __name__ == "__main__":
    main()
