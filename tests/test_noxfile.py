"""`nox -s demo` (ACT) and `nox -s demo_vla` (SmolVLA with the language instruction) run on the embedded
camera task and end by saying where their outputs are and how to run the tools yourself; `nox -s
typecheck` runs mypy --strict over every module a public name of ckpt_tools or trainer comes from;
`nox -s lerobot_side` runs LeRobot's side only when given a LeRobot venv; `nox -s tests_isa` reruns the
numerical tests under other instruction sets, and CI runs it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import types
from pathlib import Path

import pytest

import ckpt_tools
import trainer

ROOT = Path(__file__).parents[1]


class _Session:
    def __init__(self) -> None:
        self.posargs: list[str] = []
        self.bin = "/repo/.nox/demo/bin"
        self.calls: list[tuple] = []
        self.logged: list[str] = []

    def install(self, *args: str) -> None:
        pass

    def run(self, *args: str, **kwargs: object) -> None:
        self.calls.append(args)

    def log(self, message: str) -> None:
        self.logged.append(message)


@pytest.fixture
def noxfile(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """The noxfile with a stand-in `nox` module: its sessions are plain functions here."""
    stub = types.ModuleType("nox")
    stub.options = types.SimpleNamespace()  # type: ignore[attr-defined]
    stub.Session = _Session  # type: ignore[attr-defined]
    stub.session = lambda func=None, **kwargs: func if func else (lambda f: f)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "nox", stub)
    spec = importlib.util.spec_from_file_location("noxfile_under_test", ROOT / "noxfile.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_demo_ends_with_where_the_outputs_are_and_how_to_run_the_tools(noxfile, monkeypatch) -> None:
    monkeypatch.setattr("shutil.rmtree", lambda *args, **kwargs: None)
    session = _Session()
    noxfile.demo(session)
    assert session.calls[-2][:2] == ("ckpt", "verify")
    assert session.calls[-1][:2] == ("trainer", "eval")  # the epilogue comes after the last command
    note, text = session.logged
    assert "--dataset.camera=true" in note and "smaller than LeRobot's defaults" in note
    assert "--policy.type=act" in session.calls[0] and "--dataset.camera=true" in session.calls[0]
    out = noxfile.DEMO_OUTPUT
    for expected in (
        f"{out}/checkpoints/",
        f"{out}/loss_curve.png",
        f"{out}/metrics.jsonl",
        f"source {session.bin}/activate",
        f"ckpt inspect {out}/checkpoints/last",
        f"ckpt diff {out}/checkpoints/000100 {out}/checkpoints/last",
        "trainer train --policy.type=act --help",
        f"trainer eval --policy.path={out}/checkpoints/last",
        f"trainer train --output_dir={out} --resume=true",
    ):
        assert expected in text, expected


def test_demo_vla_trains_smolvla_on_the_camera_task_offline_and_evaluates_it(noxfile, monkeypatch) -> None:
    monkeypatch.setattr("shutil.rmtree", lambda *args, **kwargs: None)
    session = _Session()
    noxfile.demo_vla(session)
    train, out = session.calls[0], noxfile.DEMO_VLA_OUTPUT
    assert "--policy.type=smolvla" in train and "--dataset.camera=true" in train
    assert "--parallelism.dp_shard=2" in train and f"--output_dir={out}" in train
    backbone = next(a.split("=", 1)[1] for a in train if a.startswith("--policy.vlm_model_name="))
    assert (ROOT / backbone / "config.json").is_file() and (ROOT / backbone / "tokenizer.json").is_file()
    assert not backbone.startswith("tests") and "--policy.load_vlm_weights=false" in train  # offline
    assert session.calls[-1] == ("trainer", "eval", f"--policy.path={out}/checkpoints/last")
    note, text = session.logged
    assert "language instruction" in note
    for expected in (
        f"ckpt diff {out}/checkpoints/{noxfile.DEMO_VLA_STEPS // 2:06d} {out}/checkpoints/last",
        "trainer train --policy.type=smolvla --help",
        f"trainer eval --policy.path={out}/checkpoints/last",
    ):
        assert expected in text, expected


def test_gpu_runs_the_smoke_script_without_the_cpu_torch_pin(noxfile) -> None:
    installed: list[tuple[str, ...]] = []
    session = _Session()
    session.install = lambda *args: installed.append(args)  # type: ignore[method-assign]
    session.posargs = ["--steps", "50"]
    noxfile.gpu(session)
    assert session.calls == [("python", "benchmarks/gpu_smoke.py", "--steps", "50")]
    assert installed and not any("constraints.txt" in arg for args in installed for arg in args)


def test_lerobot_side_runs_only_beside_a_lerobot_venv(noxfile, monkeypatch) -> None:
    """Without LEROBOT_PYTHON or LEROBOT_MAIN_PYTHON the session names both and runs nothing (exit 0);
    with LeRobot main's alone, the way back only; with LeRobot 0.6.1's, the check, then the step-time
    bench of SmolVLA, ACT, Diffusion Policy and pi0.5, each in LeRobot's venv beside ours, and FastWAM's."""
    monkeypatch.delenv("LEROBOT_PYTHON", raising=False)
    monkeypatch.delenv("LEROBOT_MAIN_PYTHON", raising=False)
    session = _Session()
    noxfile.lerobot_side(session)
    assert session.calls == [] and all(
        v in session.logged[0] for v in ("LEROBOT_PYTHON", "LEROBOT_MAIN_PYTHON")
    )
    monkeypatch.setenv("LEROBOT_MAIN_PYTHON", "/venvs/main/bin/python")
    noxfile.lerobot_side(session)
    main_resume = (
        "python",
        "benchmarks/lerobot_side.py",
        "main-resume",
        "--lerobot-main-python=/venvs/main/bin/python",
    )
    assert session.calls == [main_resume]
    monkeypatch.delenv("LEROBOT_MAIN_PYTHON")
    session = _Session()
    monkeypatch.setenv("LEROBOT_PYTHON", "/venvs/lerobot/bin/python")
    session.posargs = ["--steps=5"]
    noxfile.lerobot_side(session)
    lerobot = "--lerobot-python=/venvs/lerobot/bin/python"
    assert session.calls == [
        ("python", "benchmarks/lerobot_side.py", "check", lerobot),
        ("python", "benchmarks/bench_smolvla_lerobot.py", lerobot, "--policy=smolvla", "--steps=5"),
        ("python", "benchmarks/bench_smolvla_lerobot.py", lerobot, "--policy=act", "--steps=5"),
        ("python", "benchmarks/bench_smolvla_lerobot.py", lerobot, "--policy=diffusion", "--steps=5"),
        ("python", "benchmarks/bench_smolvla_lerobot.py", lerobot, "--policy=pi05", "--steps=5"),
        ("python", "benchmarks/bench_fastwam_lerobot.py", lerobot, "--steps=5"),
    ]


def test_the_strict_typecheck_covers_every_module_a_public_name_comes_from(noxfile) -> None:
    """`nox -s typecheck` asks the installed packages for their public modules; what it gets names each
    package and the module defining each public name, so `mypy --strict` reads each definition."""
    listed = subprocess.run(
        [sys.executable, "-c", noxfile.PUBLIC_MODULES], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    defining = {getattr(ckpt_tools, name).__module__ for name in ckpt_tools._EXPORTS}
    defining |= {getattr(ckpt_tools.training, name).__module__ for name in ckpt_tools.training._EXPORTS}
    defining |= {getattr(trainer, name).__module__ for name in trainer._EXPORTS}
    assert set(listed) == {"ckpt_tools", "trainer", *defining, *ckpt_tools._MODULES.values()}


def test_tests_isa_reruns_the_numerical_tests_under_each_instruction_set(noxfile) -> None:
    """`-m numerics` once per setting, each with its environment (subprocesses and torchrun ranks
    inherit it): MKL, oneDNN and ATen held to AVX2, then ATen's plain loops (oneDNN below AMX, whose
    bfloat16 path ATen's plain loops cannot pack for); CI runs the session."""
    runs: list[tuple[tuple[str, ...], dict]] = []
    session = _Session()
    session.run = lambda *args, **kwargs: runs.append((args, kwargs))  # type: ignore[method-assign]
    session.posargs = ["-x"]
    noxfile.tests_isa(session)
    assert [args for args, _ in runs] == [("pytest", "-m", "numerics", "-x")] * 2
    assert [kwargs["env"] for _, kwargs in runs] == [
        {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"},
        {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
    ]
    assert "tests_isa" in (ROOT / ".ci" / "run").read_text().split("nox -s", 1)[1].splitlines()[0]


def test_the_numerics_marker_selects_stored_references_and_summation_orders() -> None:
    """The lane's selection: declared in pyproject's markers, and it holds the tests whose expectations
    are another CPU's or another order's floats (the legacy actions, LeRobot's SmolVLA outputs,
    micro-batches against one batch), not every test."""
    import tomllib

    markers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    assert any(marker.startswith("numerics:") for marker in markers)
    files = [
        "tests/training/test_legacy_checkpoints.py",
        "tests/training/test_engine.py",
        "tests/training/test_smolvla.py",
    ]
    listed = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "numerics", "-p", "no:cacheprovider", *files],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    ).stdout.splitlines()  # fmt: skip
    selected = [line for line in listed if "::" in line]
    for expected in (
        "tests/training/test_legacy_checkpoints.py::test_old_checkpoint_acts_as_it_did[act]",
        "tests/training/test_engine.py::test_gradient_accumulation_gives_the_same_update",
        "tests/training/test_smolvla.py::test_actions_and_loss_are_lerobots[reference]",
    ):
        assert expected in selected, (expected, listed[-5:])
    # not every test of those files: one that compares no floats stays out of the lane
    assert not [
        line for line in selected if "test_old_checkpoint_evaluates" in line or "test_defaults" in line
    ]


def test_the_suites_workers_build_each_module_fixture_once(noxfile, tmp_path: Path) -> None:
    """`nox -s tests` splits the suite by file (its XDIST flags), so a module fixture (a training run in
    tests/distributed/) is built by one worker, once. Red on `--dist loadgroup` under pytest 9.2, whose
    items no longer carry xdist's group suffix: each test was its own group, and both workers built it."""
    log = tmp_path / "setups.log"
    for name in ("a", "b", "c"):
        (tmp_path / f"test_{name}.py").write_text(
            "import os, pytest\n"
            "@pytest.fixture(scope='module')\n"
            "def run():\n"
            f"    with open({str(log)!r}, 'a') as f:\n"
            f"        f.write('{name} %d\\n' % os.getpid())\n"
            "@pytest.mark.parametrize('n', range(6))\n"
            "def test_x(run, n):\n"
            "    pass\n"
        )
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *noxfile.XDIST, str(tmp_path)]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    setups = sorted(line.split()[0] for line in log.read_text().splitlines())
    assert setups == ["a", "b", "c"]
