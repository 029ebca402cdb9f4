"""Developer sessions. Every session installs under constraints.txt, which pins the CPU torch build."""

from __future__ import annotations

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["lint", "tests"]

CONSTRAINTS = ("-c", "constraints.txt")
PACKAGES = ("-e", "packages/ckpt-tools[test]", "-e", "packages/trainer[test,tracking]")


def install(session: nox.Session, *extra: str) -> None:
    session.install(*CONSTRAINTS, *PACKAGES, *extra)


@nox.session
def tests(session: nox.Session) -> None:
    """Unit, CLI and multi-process (gloo) tests."""
    install(session)
    session.run("pytest", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and format check."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy over both packages."""
    install(session, "mypy>=1.10")
    session.run("mypy")


@nox.session
def bench(session: nox.Session) -> None:
    """Conversion benchmark (ckpt convert vs a copy, torch's dcp_to_torch_save, accelerate's merge),
    then the LeRobotDataset input benchmark (load time of 1M frames x 32 features, step time vs size).

    Options after `--` go to the conversion benchmark, e.g. `nox -s bench -- --size-mb 1600 --repeat 3`.
    """
    install(session)
    session.run("python", "benchmarks/bench_convert.py", *session.posargs)
    session.run("python", "benchmarks/bench_lerobot.py")


DEMO_OUTPUT = "outputs/demo"


@nox.session
def demo(session: nox.Session) -> None:
    """Train the default policy on the embedded dataset with 2 processes (FSDP2, DCP checkpoints),
    then inspect, convert and verify the last checkpoint. Extra trainer flags go after `--`."""
    import shutil

    install(session)
    shutil.rmtree(DEMO_OUTPUT, ignore_errors=True)  # a fresh run each time (the trainer refuses to mix)
    session.run(
        "torchrun", "--standalone", "--nproc-per-node=2", "-m", "trainer.cli", "train",
        "--parallelism.dp_shard=2", "--checkpoint_format=dcp", "--job_name=demo",
        f"--output_dir={DEMO_OUTPUT}", *session.posargs,
        env={"OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    session.run("ckpt", "inspect", f"{DEMO_OUTPUT}/checkpoints/last")
    session.run("ckpt", "convert", f"{DEMO_OUTPUT}/checkpoints/last")
    session.run("ckpt", "verify", f"{DEMO_OUTPUT}/checkpoints/last")
    session.log(demo_epilogue(DEMO_OUTPUT, session.bin))


def demo_epilogue(output: str, bin_dir: str) -> str:
    """What the demo leaves where, and how to run the same commands yourself."""
    last = f"{output}/checkpoints/last"
    return "\n".join(
        [
            "demo done. Outputs:",
            f"  checkpoints   {output}/checkpoints/ (last -> the final step; model.safetensors converted beside the DCP shards)",
            f"  loss curve    {output}/loss_curve.png",
            f"  metrics       {output}/metrics.jsonl (one JSON record per line)",
            f"Run the tools yourself (the demo's environment is {bin_dir}; `source {bin_dir}/activate` first):",
            f"  ckpt inspect {last}            # summary; --tensors lists every tensor",
            f"  ckpt verify {last}",
            f"  ckpt diff {output}/checkpoints/000250 {last}",
            "  trainer train --help                       # every flag",
            f"  trainer train --output_dir={output} --resume=true --steps=600   # continue this run",
        ]
    )
