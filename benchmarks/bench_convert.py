"""Conversion benchmark: DCP shards -> one file, against the floor (a copy) and the reference tools.

Writes a >= 1.5 GB FSDP2 DCP checkpoint from 4 gloo ranks, then runs, each in its own child process:
copying the shard directory (the floor), torch's `dcp_to_torch_save`, accelerate's `merge_fsdp_weights`
and `ckpt convert`. Wall time includes interpreter start-up for every tool (each run starts after `sync`); peak RSS is the kernel's
high-water mark of that child (`wait4`), cross-checked by sampling it with psutil. Prints a table with
ratios. Run through `nox -s bench` (never part of the tests).

Usage: python benchmarks/bench_convert.py [--size-mb 1600] [--repeat 2] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

HERE = Path(__file__).parent
PY = sys.executable
CKPT = str(Path(sys.executable).parent / "ckpt")


@dataclass
class Measurement:
    tool: str
    seconds: float
    peak_rss_mb: float


def run_measured(command: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MB) of one child process: the kernel's high-water mark from wait4,
    never below what psutil saw while sampling every 10 ms."""
    with tempfile.TemporaryFile() as errors:
        start = time.perf_counter()
        child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=errors)
        process = psutil.Process(child.pid)
        sampled = 0
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            with contextlib.suppress(psutil.Error):
                sampled = max(sampled, process.memory_info().rss)
            time.sleep(0.01)
        seconds = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != 0:
            errors.seek(0)
            raise SystemExit(f"{command[:3]} failed:\n{errors.read().decode()[-3000:]}")
    return seconds, max(usage.ru_maxrss * 1024, sampled) / 1e6  # ru_maxrss is in KiB on Linux


def tools(source: Path, out: Path) -> dict[str, list[str]]:
    dcp_dir = str(source / "pytorch_model_fsdp_0")
    return {
        "copy (floor)": ["cp", "-r", dcp_dir, str(out / "copy")],
        "torch dcp_to_torch_save": [
            PY,
            "-c",
            "import sys; from torch.distributed.checkpoint.format_utils import dcp_to_torch_save;"
            "dcp_to_torch_save(sys.argv[1], sys.argv[2])",
            dcp_dir,
            str(out / "model.pt"),
        ],
        "accelerate merge_fsdp_weights": [
            PY,
            "-c",
            "import sys; from accelerate.utils import merge_fsdp_weights;"
            "merge_fsdp_weights(sys.argv[1], sys.argv[2], safe_serialization=True)",
            dcp_dir,
            str(out / "accelerate"),
        ],
        "ckpt convert": [
            CKPT,
            "convert",
            dcp_dir,
            "--output",
            str(out / "ckpt"),
            "--json",
        ],
    }


def write_checkpoint(workdir: Path, size_mb: int) -> Path:
    source = workdir / "source"
    if (source / "pytorch_model_fsdp_0" / ".metadata").exists():
        return source
    command = [
        PY, "-m", "torch.distributed.run", "--standalone", "--rdzv-endpoint=localhost:0",
        "--nproc-per-node=4", str(HERE / "write_fsdp_dcp.py"), str(source), str(size_mb),
    ]  # fmt: skip
    subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL)
    return source


def directory_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def measure(source: Path, workdir: Path, repeat: int) -> list[Measurement]:
    """Best of `repeat` rounds; the tools take turns within a round, and every run starts after
    `sync`, so no tool pays for the write-back of the previous one's output."""
    best: dict[str, Measurement] = {}
    out = workdir / "out"
    for _ in range(repeat):
        for tool in tools(source, out):
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            os.sync()
            seconds, peak = run_measured(tools(source, out)[tool])
            if tool not in best or seconds < best[tool].seconds:
                best[tool] = Measurement(tool, seconds, peak)
    shutil.rmtree(out, ignore_errors=True)
    return list(best.values())


def table(results: list[Measurement], size_bytes: int) -> str:
    floor = results[0].seconds
    ours = next(r for r in results if r.tool == "ckpt convert")
    lines = [
        f"DCP checkpoint: {size_bytes / 1e9:.2f} GB, 4 FSDP2 ranks; best of the repeats",
        "",
        "| tool | time (s) | x copy | x ckpt convert | peak RSS (MB) |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.tool} | {r.seconds:.2f} | {r.seconds / floor:.2f} | {r.seconds / ours.seconds:.2f} "
            f"| {r.peak_rss_mb:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1600)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=None, help="kept between runs when given")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="ckpt-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        source = write_checkpoint(workdir, args.size_mb)
        results = measure(source, workdir, args.repeat)
        print(table(results, directory_bytes(source / "pytorch_model_fsdp_0")))
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
