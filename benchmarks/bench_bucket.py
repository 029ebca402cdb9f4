"""Bucket benchmark: host memory of `ckpt convert` and `ckpt push` streaming from and to an
S3-compatible bucket (moto's server on loopback, s3fs as the client, as in the tests), as ratios to
baselines measured in the same run.

For each checkpoint size, an FSDP2 DCP checkpoint (write_fsdp_dcp.py, 4 gloo ranks) is uploaded to a
bucket; then, each in its own child process (peak RSS: the kernel's high-water mark, bench_convert.py):
- `ckpt convert` of the local copy to a local file: the local bound;
- `ckpt inspect` of the bucket copy: the floor of any bucket command (the S3 client's imports and a
  metadata read, no tensor data);
- `ckpt convert` bucket to bucket (ranged reads in, multipart upload out);
- `ckpt push` of that converted result to another prefix of the bucket.
What streaming costs is the peak above the floor; it must not grow with the checkpoint's size. The wall
time of the bucket conversion is printed too (loopback, so it shows request overhead, not bandwidth).

Usage: python benchmarks/bench_bucket.py [--sizes-mb 100 300] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_convert import CKPT, PY, run_measured

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "tests"))  # the suite's server helper, shared rather than copied

from helpers.s3_server import start_s3_server  # noqa: E402


def write_checkpoint(directory: Path, size_mb: int) -> Path:
    if not (directory / "pytorch_model_fsdp_0" / ".metadata").exists():
        command = [
            PY, "-m", "torch.distributed.run", "--standalone", "--rdzv-endpoint=localhost:0",
            "--nproc-per-node=4", str(HERE / "write_fsdp_dcp.py"), str(directory), str(size_mb),
        ]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
    return directory / "pytorch_model_fsdp_0"


def on_store(code: str, *args: str) -> None:
    """Run `code` (with `fs`, the S3 filesystem, and `args`) in a child process. This process never
    imports the S3 client: a child starts as a copy of its parent, and the kernel's high-water mark of
    every measured command would then begin at this process's size."""
    prelude = "import sys, fsspec; fs = fsspec.filesystem('s3'); args = sys.argv[1:]; "
    subprocess.run([PY, "-c", prelude + code, *args], check=True)


def measure_size(workdir: Path, bucket: str, size_mb: int) -> dict[str, float]:
    """Peak RSS (MB) of each command for one checkpoint size."""
    local = write_checkpoint(workdir / f"source-{size_mb}", size_mb)
    remote = f"{bucket}/source-{size_mb}/pytorch_model_fsdp_0"
    on_store("fs.put(args[0], args[1], recursive=True)", str(local), remote)
    converted, published = f"{bucket}/converted-{size_mb}", f"{bucket}/published-{size_mb}"
    local_out = workdir / f"converted-{size_mb}"
    shutil.rmtree(local_out, ignore_errors=True)
    peaks = {
        "local convert": run_measured([CKPT, "convert", str(local), "--output", str(local_out)])[1],
        "bucket floor (inspect)": run_measured([CKPT, "inspect", remote])[1],
    }
    seconds, peaks["bucket convert"] = run_measured([CKPT, "convert", remote, "--output", converted])
    peaks["bucket push"] = run_measured([CKPT, "push", converted, published])[1]
    shutil.rmtree(local_out, ignore_errors=True)
    return {
        **peaks,
        "convert s": seconds,
        "bytes": sum(p.stat().st_size for p in local.iterdir() if p.is_file()),
    }


def table(results: dict[int, dict[str, float]]) -> str:
    lines = [
        "bucket: moto S3 server on 127.0.0.1, s3fs; peak RSS per command (MB), ratio to the bucket floor",
        "",
        "| checkpoint | local convert | bucket floor (inspect) | bucket convert | x floor | bucket push | x floor "
        "| bucket convert time |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in results.values():
        floor = row["bucket floor (inspect)"]
        lines.append(
            f"| {row['bytes'] / 1e6:.0f} MB | {row['local convert']:.0f} | {floor:.0f} "
            f"| {row['bucket convert']:.0f} | {row['bucket convert'] / floor:.2f} "
            f"| {row['bucket push']:.0f} | {row['bucket push'] / floor:.2f} | {row['convert s']:.1f} s |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[100, 300])
    parser.add_argument("--workdir", type=Path, default=None, help="kept between runs when given")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="ckpt-bench-bucket-"))
    workdir.mkdir(parents=True, exist_ok=True)
    server = start_s3_server()
    os.environ.update(server.env)  # the child processes reach the server as a user's would
    try:
        on_store("fs.mkdir('bench')")
        results = {size: measure_size(workdir, "s3://bench", size) for size in args.sizes_mb}
        print(table(results))
    finally:
        server.stop()
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
