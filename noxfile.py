"""Developer sessions. Every session installs under constraints.txt, which pins the CPU torch build."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["lint", "tests"]

CONSTRAINTS = ("-c", "constraints.txt")
PACKAGES = (
    "-e",
    "packages/ckpt-tools[test]",
    "-e",
    "packages/trainer[test,tracking,augment,smolvla,pi,diffusion,fastwam,pusht,ft]",
)


def install(session: nox.Session, *extra: str) -> None:
    session.install(*CONSTRAINTS, *PACKAGES, *extra)


# Two pytest-xdist workers, each taking whole test files (a module's fixture is built once), the files
# that launch processes first (tests/conftest.py orders them). `-- -n 0` runs in one process.
XDIST = ("-n", "2", "--dist", "loadfile", "--no-loadscope-reorder")


@nox.session
def tests(session: nox.Session) -> None:
    """Unit, CLI and multi-process (gloo) tests, on 2 pytest-xdist workers. Options after `--` go to
    pytest, e.g. `nox -s tests -- tests/ckpt -n 0`."""
    install(session)
    session.run("pytest", *XDIST, *session.posargs)


# Other CPU instruction sets for `tests_isa`: MKL (matmul), oneDNN (convolutions) and ATen (elementwise
# and reduction kernels) held to AVX2, and ATen's plain C++ loops. Each splits and orders float sums
# otherwise than an AVX-512 or AMX CPU, so an expectation that holds on one CPU only goes red here.
ISA_SETTINGS: dict[str, dict[str, str]] = {
    "avx2": {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"},
    # oneDNN capped below AMX: its bfloat16 matmul on an AMX CPU packs through ATen's VNNI helper,
    # which refuses to run under ATen's default kernels ("pack_vnni2 is only supported when avx512 is")
    "default": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
}


@nox.session
def tests_isa(session: nox.Session) -> None:
    """The numerical tests (`-m numerics`: stored references such as LeRobot's outputs and the legacy
    checkpoints' actions, micro-batches against one batch, resumes) again under each of ISA_SETTINGS,
    where torch's kernels sum in other orders than on the machine that wrote the expectations.
    Options after `--` go to pytest, e.g. `nox -s tests_isa -- -x`."""
    install(session)
    for name, env in ISA_SETTINGS.items():
        session.log(f"tests_isa: {name}: {' '.join(f'{k}={v}' for k, v in env.items())}")
        session.run("pytest", "-m", "numerics", *session.posargs, env=env)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and format check."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


# Both packages' public modules: each package and every module its lazy table takes a public name from
PUBLIC_MODULES = (
    "import ckpt_tools, ckpt_tools.training, trainer; "
    "print(*sorted({'ckpt_tools', *ckpt_tools._EXPORTS.values(), *ckpt_tools._MODULES.values(), "
    "*ckpt_tools.training._EXPORTS.values(), 'trainer', *trainer._EXPORTS.values()}))"
)


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy over both packages, then `mypy --strict` over their public modules: the API the trainer,
    evaluation pipelines and LeRobot users type against (the modules they import are read, not
    reported)."""
    install(session, "mypy>=1.10")
    session.run("mypy")
    modules = str(session.run("python", "-c", PUBLIC_MODULES, silent=True)).split()
    targets = [arg for module in modules for arg in ("-m", module)]
    session.run("mypy", "--strict", "--follow-imports=silent", *targets)


API_DOCS = "build/api"


@nox.session
def docs(session: nox.Session) -> None:
    """ckpt_tools' API reference for evaluation pipelines and other library users (pdoc, into
    build/api/index.html), in its two tiers: the public names of `import ckpt_tools` with its `layout`
    and `storage` modules, and the trainer's tier `ckpt_tools.training`. Any warning fails the build (a public name that does not resolve, a bad annotation)."""
    install(session, "pdoc>=15")
    session.run("python", "-W", "error", "docs/build_api.py", API_DOCS)
    session.log(f"API reference: {API_DOCS}/index.html")


@nox.session
def bench(session: nox.Session) -> None:
    """Conversion benchmark (ckpt convert vs a copy, torch's dcp_to_torch_save, accelerate's merge),
    then the LeRobotDataset input benchmark (load time of 1M frames x 32 features, step time vs size),
    then the mixture benchmark (sampling overhead per batch of a weighted mixture vs one dataset, against
    an ACT step), then the streaming benchmark (samples/s of a camera dataset streamed from moto's S3
    server vs local disk, 2 workers, and the workers' VmHWM),
    then the camera benchmark (pipeline frames/s in training order vs PyAV front to back, worker RSS)
    and the share of a 2-rank ACT step, and of a Diffusion Policy step with 2 observation steps, spent
    waiting for camera data, from disk and streamed,
    then the engine benchmark (trainer step time vs a bare FSDP2 loop, save stall vs a raw dcp.save,
    resume peak RSS per rank vs a fresh start), then activation checkpointing's saved activations and
    step time and compile's step time against a plain policy, then the save stall of --async_save against a
    synchronous save, then the bucket benchmark (peak RSS of `ckpt convert` and `ckpt push` streaming
    from and to moto's S3 server, against the S3 client's floor and a local conversion), then what
    --save_checkpoint_to_hub costs a run against the same run without pushes (loopback Hub), then the start
    time of `ckpt inspect --json` against `hf version`, then the ACT benchmark (two 96x96 cameras:
    trainer step time vs a bare FSDP2 loop, peak RSS with the trunk frozen vs trained), then the memory
    benchmark (a 470 M-parameter policy built on meta on 1, 2 and 4 gloo ranks and HSDP 2x2: per-rank peak RSS at
    build, first step and save against 16 B/param / N + a tiny run's; then the default-size SmolVLA on 4 ranks),
    then the evaluation benchmark (training steps/s with the evaluator on its own core vs without it, and
    PushT / ALOHA seconds per episode), then the fault-tolerance benchmark (steps/s of two torchft replica
    groups vs plain 2-rank DDP; with one group SIGKILLed and relaunched: the survivor's steps while it was
    down, the time until it is back in the quorum, the steps lost vs a restart from `last`).

    Options after `--` go to the conversion benchmark, e.g. `nox -s bench -- --size-mb 1600 --repeat 3`.
    """
    install(session)
    session.run("python", "benchmarks/bench_convert.py", *session.posargs)
    session.run("python", "benchmarks/bench_lerobot.py")
    session.run("python", "benchmarks/bench_mixture.py")
    session.run("python", "benchmarks/bench_stream.py")
    session.run("python", "benchmarks/bench_video.py")
    session.run("python", "benchmarks/bench_data_wait.py")
    session.run("python", "benchmarks/bench_data_wait.py", "--policy", "diffusion")
    session.run("python", "benchmarks/bench_manifest.py")
    session.run("python", "benchmarks/bench_engine.py")
    session.run("python", "benchmarks/bench_compile.py")
    session.run("python", "benchmarks/bench_async_save.py")
    session.run("python", "benchmarks/bench_bucket.py")
    session.run("python", "benchmarks/bench_hub_push.py")
    session.run("python", "benchmarks/bench_cli.py")
    session.run("python", "benchmarks/bench_act.py")
    session.run("python", "benchmarks/bench_memory.py")
    session.run("python", "benchmarks/bench_memory.py", "--policy", "smolvla")
    session.run("python", "benchmarks/bench_eval.py")
    session.run("python", "benchmarks/bench_ft.py")


@nox.session
def gpu(session: nox.Session) -> None:
    """GPU smoke lane, on a CUDA machine (not CI): bf16 training on one GPU, synchronous and background
    DCP saves, a bit-exact resume, conversion and load_policy on CUDA, with step time, samples/s and the
    save stall against a raw dcp.save, and the device memory of a large act_state and of LeRobot's pi0.5
    (the `pi` extra) built on meta (benchmarks/gpu_smoke.py; says so and exits 0 without CUDA).
    Installed without constraints.txt, whose torch pin is the CPU build: pip picks the CUDA wheel."""
    session.install("-e", "packages/ckpt-tools", "-e", "packages/trainer[pi]")
    session.run("python", "benchmarks/gpu_smoke.py", *session.posargs)


@nox.session
def lerobot_side(session: nox.Session) -> None:
    """LeRobot 0.6.1 itself beside this trainer, when LEROBOT_PYTHON names the Python of a venv with
    `lerobot[smolvla,diffusion,pi]==0.6.1` (says so and exits 0 otherwise): an ACT with cameras, a SmolVLA,
    a Diffusion Policy (with cameras, and with an environment state) trained here, LeRobot's Diffusion
    checkpoint fine-tuned on FSDP2 x2 with an EMA, LeRobot's tiny pi0.5 and tiny FastWAM fine-tuned on FSDP2 x2, exported, load
    in LeRobot's `from_pretrained(dir, strict=True)` and act as ours within 1e-5, and so do LeRobot's
    `make_pre_post_processors(pretrained_path=export)` around them on a raw observation
    (benchmarks/lerobot_side.py check), then the training step time of our SmolVLA, ACT, Diffusion Policy
    and pi0.5 against LeRobot's on the same checkpoint and batch (benchmarks/bench_smolvla_lerobot.py),
    and of our FastWAM against LeRobot's, tiny and mid-sized, step by step in one process
    (benchmarks/bench_fastwam_lerobot.py); options after `--` go to each bench, e.g. `-- --repeat 5`. When LEROBOT_MAIN_PYTHON names the Python of
    a venv with LeRobot main installed from its source, first the way back: LeRobot main's own
    `lerobot-train --resume=true` continues a step of ours exported with `trainer export --lerobot_step=true`
    (benchmarks/lerobot_main_resume.py)."""
    lerobot_main_python = os.environ.get("LEROBOT_MAIN_PYTHON")
    lerobot_python = os.environ.get("LEROBOT_PYTHON")
    if not lerobot_python and not lerobot_main_python:
        session.log(
            "lerobot_side: neither LEROBOT_PYTHON (a venv's Python with lerobot==0.6.1) nor LEROBOT_MAIN_PYTHON "
            "(a venv's Python with LeRobot main installed from its source) is set"
        )
        return
    install(session)
    if lerobot_main_python:
        session.run(
            "python",
            "benchmarks/lerobot_side.py",
            "main-resume",
            f"--lerobot-main-python={lerobot_main_python}",
        )
    if not lerobot_python:
        session.log("lerobot_side: LEROBOT_PYTHON is not set: LeRobot 0.6.1's checks skipped")
        return
    session.run("python", "benchmarks/lerobot_side.py", "check", f"--lerobot-python={lerobot_python}")
    bench = ("benchmarks/bench_smolvla_lerobot.py", f"--lerobot-python={lerobot_python}")
    for policy in ("smolvla", "act", "diffusion", "pi05"):
        session.run("python", *bench, f"--policy={policy}", *session.posargs)
    session.run(
        "python",
        "benchmarks/bench_fastwam_lerobot.py",
        f"--lerobot-python={lerobot_python}",
        *session.posargs,
    )


DEMO_OUTPUT = "outputs/demo"


# The demo's ACT is LeRobot's architecture at a size that trains in about 5 minutes on 2 CPU cores
# (LeRobot's defaults: dim_model 512, 4+4 encoder layers, chunk_size 100); its trunk starts from
# scratch, since the demo runs offline (`--policy.pretrained_backbone_weights=null`). It trains at 1e-3
# with the engine's cosine schedule, not ACT's preset (1e-5, constant: too slow for 200 steps), so it
# turns the preset off and states its rates.
DEMO_ACT = [
    "--policy.type=act", "--policy.dim_model=64", "--policy.n_heads=4", "--policy.dim_feedforward=128",
    "--policy.n_encoder_layers=2", "--policy.n_vae_encoder_layers=2", "--policy.latent_dim=16",
    "--policy.chunk_size=10", "--policy.n_action_steps=5", "--policy.dropout=0",
    "--policy.pretrained_backbone_weights=null", "--policy.optimizer_lr_backbone=1e-3",
    "--use_policy_training_preset=false", "--optimizer.lr=1e-3",
    "--dataset.camera=true", "--dataset.episodes=40", "--dataset.eval_episodes=8",
    "--steps=200", "--save_freq=100", "--log_freq=50", "--batch_size=16",
]  # fmt: skip
DEMO_NOTE = (
    "demo: ACT with the camera on the embedded camera task (--dataset.camera=true), smaller than "
    "LeRobot's defaults (dim_model=64, 2 encoder layers, chunk_size=10, 200 steps) and with the ResNet-18 "
    "trunk trained from scratch (offline), at lr 1e-3 with the engine's cosine schedule instead of ACT's "
    "preset (1e-5, constant), so that it finishes in about 5 minutes on 2 CPU cores"
)


@nox.session
def demo(session: nox.Session) -> None:
    """Train ACT with the camera on the embedded camera task with 2 processes (FSDP2, DCP checkpoints),
    inspect, convert and verify the last checkpoint, then score it with `trainer eval` (rollouts from
    pixels + state). Extra trainer flags go after `--`."""
    run_demo(session, DEMO_ACT, DEMO_OUTPUT, "demo", DEMO_NOTE)
    session.log(demo_epilogue(DEMO_OUTPUT, session.bin, "act", steps=200))


DEMO_VLA_OUTPUT = "outputs/demo_vla"

# The VLA demo's SmolVLA is LeRobot's architecture on a tiny backbone shipped in demo/tiny_smolvlm (a
# SmolVLM config and tokenizer, no weights: the VLM starts from scratch, as the demo runs offline). Its
# training preset (AdamW, cosine decay with warmup) keeps LeRobot's form at a demo's length: lr 1e-3,
# 20 warmup steps, decay over the run.
DEMO_VLA_STEPS = 600
DEMO_SMOLVLA = [
    "--policy.type=smolvla", "--policy.vlm_model_name=demo/tiny_smolvlm", "--policy.load_vlm_weights=false",
    "--policy.num_vlm_layers=4", "--policy.chunk_size=10", "--policy.n_action_steps=5",
    "--policy.num_steps=3", "--policy.resize_imgs_with_padding=[32,32]",
    "--policy.optimizer_lr=1e-3", "--policy.scheduler_warmup_steps=20",
    f"--policy.scheduler_decay_steps={DEMO_VLA_STEPS}",
    "--dataset.camera=true", "--dataset.episodes=40", "--dataset.eval_episodes=8",
    f"--steps={DEMO_VLA_STEPS}", f"--save_freq={DEMO_VLA_STEPS // 2}", "--log_freq=50", "--batch_size=16",
]  # fmt: skip
DEMO_VLA_NOTE = (
    "demo_vla: SmolVLA on the embedded camera task (--dataset.camera=true) with its language instruction "
    "(each frame's task text, and the rollouts'), on the tiny backbone in demo/tiny_smolvlm (a 4-layer "
    "VLM of width 64 from scratch, offline), chunk_size=10, 3 flow steps, 600 steps of SmolVLA's preset "
    "at lr 1e-3, so that it finishes in about 5 minutes on 2 CPU cores"
)


@nox.session
def demo_vla(session: nox.Session) -> None:
    """Train SmolVLA (a vision-language-action policy) on the embedded camera task with its language
    instruction, with 2 processes (FSDP2, DCP checkpoints), inspect, convert and verify the last
    checkpoint, then score it with `trainer eval` (rollouts from pixels + state + instruction). Extra
    trainer flags go after `--`."""
    run_demo(session, DEMO_SMOLVLA, DEMO_VLA_OUTPUT, "demo_vla", DEMO_VLA_NOTE)
    session.log(demo_epilogue(DEMO_VLA_OUTPUT, session.bin, "smolvla", steps=DEMO_VLA_STEPS))


def run_demo(session: nox.Session, flags: list[str], output: str, job: str, note: str) -> None:
    """A demo's commands: train with 2 processes, inspect/convert/verify the last checkpoint, evaluate."""
    import shutil

    install(session)
    shutil.rmtree(output, ignore_errors=True)  # a fresh run each time (the trainer refuses to mix)
    session.log(note)
    session.run(
        "torchrun", "--standalone", "--nproc-per-node=2", "-m", "trainer.cli", "train", *flags,
        "--parallelism.dp_shard=2", "--checkpoint_format=dcp", f"--job_name={job}",
        f"--output_dir={output}", *session.posargs,
        env={"OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    session.run("ckpt", "inspect", f"{output}/checkpoints/last")
    session.run("ckpt", "convert", f"{output}/checkpoints/last")
    session.run("ckpt", "verify", f"{output}/checkpoints/last")
    session.run("trainer", "eval", f"--policy.path={output}/checkpoints/last", env={"OMP_NUM_THREADS": "1"})


def demo_epilogue(output: str, bin_dir: str, policy: str, steps: int) -> str:
    """What a demo of `steps` steps (saved at half and at the end) leaves where, and how to run the same
    commands yourself."""
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
            f"  ckpt diff {output}/checkpoints/{steps // 2:06d} {last}",
            f"  trainer eval --policy.path={last}          # rollouts on the camera task",
            f"  trainer train --policy.type={policy} --help     # every flag of the policy",
            f"  trainer train --output_dir={output} --resume=true --steps={3 * steps}   # continue this run",
        ]
    )


# Module (under packages/ckpt-tools/src/ckpt_tools/) -> the fast tests that protect its guarantees: a
# file name is under tests/ckpt/, a path (with a /) under tests/.
ADAPTER_ROUND_TRIP = "trainer/test_peft_engine.py::test_adapter_checkpoint_round_trip"
MUTATION_TARGETS: dict[str, tuple[str, tuple[str, ...]]] = {
    "safe_pickle": ("dcp/safe_pickle.py", ("test_safe_pickle.py", "test_dcp_index.py")),
    "commit": (
        "files/commit.py",
        ("test_storage_commit.py", "test_last_never_absent.py", "test_retention.py"),
    ),
    "dcp_index": ("dcp/index.py", ("test_dcp_index.py", "test_convert_guarantees.py", "test_safe_pickle.py")),
    "dcp_roles": ("dcp/roles.py", ("test_dcp_index.py", "test_inspect.py")),
    "dcp_records": ("dcp/records.py", ("test_dcp_index.py", "test_convert_guarantees.py")),
    "convert": (
        "tools/convert/to_safetensors.py",
        ("test_convert_guarantees.py", "test_convert_outputs.py", "test_convert_cli.py"),
    ),
    "chunk_copy": ("tools/convert/chunk_copy.py", ("test_convert_guarantees.py", "test_convert_outputs.py")),
    "save": ("state/save.py", ("test_state_single.py", ADAPTER_ROUND_TRIP)),
    "load": (
        "state/training_load.py",
        (
            "test_state_single.py",
            "test_load_into_shards.py",
            "test_resume_pickle_guard.py",
            ADAPTER_ROUND_TRIP,
        ),
    ),
    "publish": ("tools/publish.py", ("test_publish_hub.py", "test_publish_files.py")),
    "hub_commit": ("tools/hub_commit.py", ("test_publish_hub.py",)),
}

# cosmic-ray replaces each arithmetic/bitwise operator by ten others; keep one replacement per site
# (Add->Sub, Sub->Add, Mul->Div, ...): the other nine turn the same string concatenation or size
# computation into the same TypeError or nonsense value, at the cost of nine more test runs.
ONE_BINARY_REPLACEMENT = (
    "core/ReplaceBinaryOperator_(?!Add_Sub$|Sub_Add$|Mul_Div$|Div_Mul$|FloorDiv_Div$|Mod_FloorDiv$|Pow_Mul$"
    "|BitOr_BitAnd$|BitAnd_BitOr$|LShift_RShift$|RShift_LShift$).*"
)


def skip_all_but_a_sample(db: Path, keep: int, seed: str) -> int:
    """Mark every pending mutant of a cosmic-ray session but a seeded random `keep` of them as skipped
    (what cr-filter-operators writes for a filtered one); returns how many were skipped."""
    import random
    import sqlite3

    with contextlib.closing(sqlite3.connect(db)) as con, con:
        # Ordered by what each mutant changes (job ids are random per init), so a seed draws the same ones.
        pending = [
            row[0]
            for row in con.execute(
                "SELECT job_id FROM mutation_specs WHERE job_id NOT IN (SELECT job_id FROM work_results)"
                " ORDER BY start_pos_row, start_pos_col, operator_name, occurrence"
            )
        ]
        kept = set(random.Random(seed).sample(pending, min(keep, len(pending))))
        skipped = [(job,) for job in pending if job not in kept]
        con.executemany("INSERT INTO work_results (job_id, worker_outcome) VALUES (?, 'SKIPPED')", skipped)
    return len(skipped)


def mutation_score(db: Path) -> str:
    """Killed / run of a finished cosmic-ray session (skipped mutants are not run; a mutant whose tests
    time out or crash counts as killed, as cosmic-ray counts it)."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(db)) as con:
        outcomes = dict(
            con.execute(
                "SELECT test_outcome, COUNT(*) FROM work_results WHERE worker_outcome != 'SKIPPED' GROUP BY 1"
            ).fetchall()
        )
    run = sum(outcomes.values())
    killed = run - outcomes.get("SURVIVED", 0)
    return (
        f"{killed}/{run} killed ({100 * killed / max(run, 1):.0f} %), {outcomes.get('SURVIVED', 0)} survive"
    )


@nox.session
def mutate(session: nox.Session) -> None:
    """Mutation testing (cosmic-ray) of the modules that carry guarantees. Not in CI: slow.

    `nox -s mutate -- safe_pickle commit` runs those modules only (default: all of MUTATION_TARGETS);
    `--sample=N` runs N mutants per module drawn at random (seeded by the module's name, so a rerun draws
    the same ones) and skips the rest: a whole module costs hours on 2 cores.
    cosmic-ray edits the module in place and puts it back after each mutant: run it on a clean tree and
    check `git status` if it was interrupted. Prints each module's score and its surviving mutants;
    docs/mutation.md lists the survivors of the last run and why they survive.
    """
    install(session, "cosmic-ray>=8.7,<9")
    samples = [arg for arg in session.posargs if arg.startswith("--sample=")]
    sample = int(samples[-1].removeprefix("--sample=")) if samples else None
    names = [arg for arg in session.posargs if arg not in samples] or list(MUTATION_TARGETS)
    unknown = sorted(set(names) - set(MUTATION_TARGETS))
    if unknown:
        session.error(f"unknown module {unknown[0]!r}: choose from {', '.join(MUTATION_TARGETS)}")
    workdir = Path(session.create_tmp())
    python = Path(session.bin) / "python"
    for name in names:
        module, tests = MUTATION_TARGETS[name]
        config, db = workdir / f"{name}.toml", workdir / f"{name}.sqlite"
        test_paths = " ".join(f"tests/{test}" if "/" in test else f"tests/ckpt/{test}" for test in tests)
        config.write_text(
            "[cosmic-ray]\n"
            f'module-path = "packages/ckpt-tools/src/ckpt_tools/{module}"\n'
            "timeout = 120.0\n"
            "excluded-modules = []\n"
            f'test-command = "{python} -m pytest -x -q -p no:cacheprovider {test_paths}"\n'
            "[cosmic-ray.distributor]\n"
            'name = "local"\n'
            "[cosmic-ray.filters.operators-filter]\n"
            f"exclude-operators = [{json.dumps(ONE_BINARY_REPLACEMENT)}]\n"
        )
        db.unlink(missing_ok=True)
        env = {"OMP_NUM_THREADS": "1"}
        session.run("cosmic-ray", "init", str(config), str(db), env=env)
        session.run("cr-filter-operators", str(db), str(config), env=env)
        if sample is not None:
            session.log(
                f"{name}: {skip_all_but_a_sample(db, sample, seed=name)} mutants skipped, {sample} kept"
            )
        session.run("cosmic-ray", "exec", str(config), str(db), env=env)
        session.run("cr-report", "--surviving-only", "--show-diff", str(db))
        session.log(f"{name}: {mutation_score(db)}")
