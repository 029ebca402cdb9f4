"""Operations on real processes: signals, the run lock, orphaned ranks, ranks agreeing on the resumed step.

Every run is `tests/distributed/scripts/ops_train.py` (the real CLI plus fault hooks), under torchrun
with gloo or as one plain process. docs/resume.md ("Operations") is what these tests hold the code to.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers.launch import CKPT_CLI, launch_env, no_traceback_from_us, run_torchrun, torchrun_command
from helpers.run_outputs import metrics, metrics_so_far, model_file
from helpers.train_flags import tiny_args
from helpers.waiting import wait_for

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]

SCRIPT = Path(__file__).parent / "scripts" / "ops_train.py"
MLP = ["--policy.type=mlp", "--policy.hidden_dim=16"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("ops-dataset-cache"))


def flags(out: Path, cache: str, *extra: str) -> list[str]:
    return tiny_args(str(out), cache, *MLP, *extra)


def run_single(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The script as one plain process (no launcher), output combined."""
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        env=launch_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )


def last(out: Path) -> str:
    return os.readlink(out / "checkpoints" / "last")


def verifies(path: Path) -> bool:
    return (
        subprocess.run([str(CKPT_CLI), "verify", str(path)], capture_output=True, timeout=60).returncode == 0
    )


# ------------------------------------------------------------------------------------------- signals


@pytest.mark.slow  # over 20 s
def test_sigterm_on_one_rank_stops_both_at_one_step(tmp_path, cache):
    """Rank 1 alone gets SIGTERM during step 3, twice at once (as a rank under Slurm does: the scheduler
    signals it, and torchrun forwards its own copy): both ranks stop after step 3 (the signal is agreed
    on), save it collectively, and the main rank prints the one line."""
    out = tmp_path / "run"
    args = flags(out, cache, "--collective_timeout_s=30")  # DDP over 2 ranks, 4 steps, saves every 2
    stopped = run_torchrun(SCRIPT, 2, f"--hook-signal=1:3:{int(signal.SIGTERM)}:2:0.0", *args, check=False)
    log = stopped.stdout
    assert "again: aborting" not in log, log
    assert stopped.returncode != 0
    line = f"interrupted at step 3; checkpoint {out / 'checkpoints' / '000003'}; resume with --resume=true --output_dir={out}"
    assert log.count("interrupted at step") == 1 and line in log, log
    assert "exitcode  : 143" in log, log  # torchrun's summary: 128 + SIGTERM
    assert no_traceback_from_us(log), log
    assert last(out) == "000003" and verifies(out / "checkpoints" / "last")
    assert [e["step"] for e in metrics(out, "interrupted")] == [3]
    assert not (out / "trainer.lock").exists()


@pytest.mark.slow  # two launches
def test_sigterm_to_torchrun_alone_saves_on_every_rank_and_resume_agrees_on_the_step(tmp_path, cache):
    """What Kubernetes does: SIGTERM to the launcher only (sent from rank 0 to its parent, torchrun, at
    step 3), which forwards it to both ranks. FSDP2 with DCP, so each rank writes its own shards of the
    interrupted step. The resume flips `last` back to step 2 right after the main rank resolved the
    interrupted step: both ranks still resume from that step (the main rank's choice is broadcast)."""
    out = tmp_path / "run"
    args = flags(out, cache, "--steps=8", "--parallelism.dp_shard=2", "--checkpoint_format=dcp")
    # from step 4 on, each rank waits for the forwarded signal: the run cannot end by itself before it
    hooks = ["--hook-until-signalled=4", f"--hook-signal-launcher=0:3:{int(signal.SIGTERM)}"]
    stopped = run_torchrun(SCRIPT, 2, *hooks, *args, check=False)
    log = stopped.stdout
    assert stopped.returncode != 0, log  # torchrun's own status once it has stopped its ranks
    assert f"Received {int(signal.SIGTERM)} death signal, shutting down workers" in log, log
    [stop] = metrics(out, "interrupted")
    step = stop["step"]
    assert 3 <= step < 8, log
    checkpoint = out / "checkpoints" / f"{step:06d}"
    line = (
        f"interrupted at step {step}; checkpoint {checkpoint}; resume with --resume=true --output_dir={out}"
    )
    assert log.count("interrupted at step") == 1 and line in log, log
    assert no_traceback_from_us(log) and "again: aborting" not in log, log
    assert "forcefully exiting" not in log, log  # torchrun did not have to SIGKILL a rank
    assert last(out) == checkpoint.name and verifies(checkpoint)
    shards = sorted(p.name for p in (checkpoint / "training_state" / "optimizer_0").glob("*.distcp"))
    assert shards == ["__0_0.distcp", "__1_0.distcp"], shards  # each rank saved its part of the step
    assert not (out / "trainer.lock").exists()

    resumed = run_torchrun(SCRIPT, 2, "--hook-flip-last=2", *args, "--resume=true")
    assert "hook: rank 0 resolved" in resumed.stdout and "then moved last to 2" in resumed.stdout
    assert f"hook: rank 0 resumes from {checkpoint}\n" in resumed.stdout, resumed.stdout
    assert f"hook: rank 1 resumes from {checkpoint}\n" in resumed.stdout, resumed.stdout
    assert last(out) == "000008" and verifies(out / "checkpoints" / "last")


def test_sigint_in_one_process_saves_the_current_step_and_keep_last_holds_across_the_restart(tmp_path, cache):
    """One process, --keep_last=1: saves at 2 and 4 each leave one step; SIGINT during step 5, delivered
    twice at once (as when a scheduler signals every process and a launcher forwards its own copy), saves
    5 (and prunes 4); the restart resumes from 5 with the saved --keep_last and ends with step 8 alone."""
    out = tmp_path / "run"
    args = flags(out, cache, "--steps=8", "--keep_last=1")
    stopped = run_single(f"--hook-signal=0:5:{int(signal.SIGINT)}:2:0.0", *args)
    assert stopped.returncode == 128 + signal.SIGINT, stopped.stdout
    assert f"interrupted at step 5; checkpoint {out / 'checkpoints' / '000005'};" in stopped.stdout
    assert "Traceback" not in stopped.stdout, stopped.stdout
    assert sorted(os.listdir(out / "checkpoints")) == ["000005", "last"]
    assert last(out) == "000005" and verifies(out / "checkpoints" / "000005")

    resumed = run_single(f"--output_dir={out}", "--resume=true")
    assert resumed.returncode == 0, resumed.stdout
    assert f"resuming from {out / 'checkpoints' / '000005'} at step 5" in resumed.stdout
    assert f"every 2 steps in {out}\n" in resumed.stdout  # the banner names the directory it writes to
    assert sorted(os.listdir(out / "checkpoints")) == ["000008", "last"]
    saved = json.loads(model_file(out, 8, "train_config.json").read_text())
    assert saved["resume"] is False and saved["output_dir"] == str(out)  # reproduces, not resumes


def test_second_signal_aborts_at_once_without_a_checkpoint(tmp_path, cache):
    """A second SIGTERM, 2.5 s after the first (more than the 2 s in which a repeat counts as the same
    delivery), while the first is handled."""
    out = tmp_path / "run"
    aborted = run_single(f"--hook-signal=0:3:{int(signal.SIGTERM)}:2:2.5", *flags(out, cache, "--steps=8"))
    assert aborted.returncode == 128 + signal.SIGTERM, aborted.stdout
    assert "SIGTERM again: aborting without a checkpoint" in aborted.stdout
    assert "Traceback" not in aborted.stdout and "interrupted at step" not in aborted.stdout
    assert last(out) == "000002" and not (out / "checkpoints" / "000003").exists()


# ------------------------------------------------------------------------------ bounded failures


def test_a_stalled_rank_ends_the_other_within_the_collective_timeout(tmp_path, cache):
    """Rank 1 stalls in step 3 until the launcher stops it; rank 0 waits in the step's metric reduction
    for at most --collective_timeout_s=30, then stops with one line; `last` names the step-2 checkpoint.
    (The timeout also bounds the process group's start: on a 2-core machine at load 8 the ranks'
    imports ended more than 8 s apart. The bound on the whole run is far from any machine's speed and
    far below torch's own 30 minutes.)"""
    out = tmp_path / "run"
    args = flags(out, cache, "--log_freq=1", "--collective_timeout_s=30")
    started = time.monotonic()
    failed = run_torchrun(SCRIPT, 2, "--hook-stall=1:3", *args, check=False)
    log = failed.stdout
    assert failed.returncode != 0
    errors = [line for line in log.splitlines() if line.startswith("error: rank 0: a collective")]
    assert len(errors) == 1, log
    assert "--collective_timeout_s passed" in errors[0]
    assert no_traceback_from_us(log), log
    assert time.monotonic() - started < 600
    assert last(out) == "000002" and verifies(out / "checkpoints" / "last")


def save_errors(log: str) -> list[str]:
    return [line for line in log.splitlines() if line.startswith("error: ")]


@pytest.mark.slow  # two launches
def test_main_rank_commit_failure_ends_both_ranks_with_one_line_and_resume_works(tmp_path, cache):
    """Rank 0's commit of step 4 fails: both ranks raise the same line at once (not after the
    collective timeout), `last` stays on step 2, and a resume finishes the run."""
    out = tmp_path / "run"
    args = flags(out, cache, "--collective_timeout_s=600")
    failed = run_torchrun(SCRIPT, 2, "--hook-fail-commit=4", *args, check=False, timeout=300)
    errors = save_errors(failed.stdout)
    assert len(errors) == 2 and errors[0] == errors[1], failed.stdout
    assert errors[0].startswith(
        "error: committing checkpoint step 4 failed on the main rank: OSError: injected: rename of "
        ".tmp-000004 refused; `last` still names the newest complete checkpoint"
    )
    assert no_traceback_from_us(failed.stdout), failed.stdout
    assert last(out) == "000002" and verifies(out / "checkpoints" / "last")

    run_torchrun(SCRIPT, 2, *args, "--resume=true")
    assert last(out) == "000004" and verifies(out / "checkpoints" / "last")


SHARD_FAILURES: dict[str, tuple[Path, str]] = {}


def shard_failure_run(root: Path, cache: str, mode: str) -> tuple[Path, str]:
    """FSDP2 on 2 ranks, DCP, saves at 2 and 4; rank 1's shard write of step 4 fails. Run once per mode
    (sync or --async_save) per session; returns the output dir and the log."""
    if mode not in SHARD_FAILURES:
        out = root / mode
        extra = ["--async_save=true"] if mode == "async" else []
        args = flags(out, cache, "--parallelism.dp_shard=2", "--checkpoint_format=dcp", *extra)
        failed = run_torchrun(SCRIPT, 2, "--hook-fail-shard=1:4", *args, check=False, timeout=300)
        assert failed.returncode != 0, failed.stdout
        SHARD_FAILURES[mode] = (out, failed.stdout)
    return SHARD_FAILURES[mode]


@pytest.fixture(scope="module")
def shard_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("shard-failures")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_one_rank_shard_write_failure_ends_both_ranks_with_one_line(shard_root, cache, mode):
    """In a synchronous save, and in a background one (surfacing at the next step boundary)."""
    out, log = shard_failure_run(shard_root, cache, mode)
    errors = save_errors(log)
    assert len(errors) == 2 and errors[0] == errors[1], log
    assert errors[0].startswith(
        "error: saving checkpoint step 4 failed: rank 1 could not write its shards (OSError: [Errno 28] "
        "injected: No space left on device)"
    )
    assert no_traceback_from_us(log), log
    assert last(out) == "000002" and verifies(out / "checkpoints" / "last")


def test_async_save_writes_the_state_of_its_step(shard_root, cache):
    """The background write holds the state staged at step 2, bit for bit what a synchronous save wrote,
    although training went on while it was written."""
    from ckpt_tools.state.evaluation_load import read_dcp_full
    from ckpt_tools.tensors.tensor_io import read_safetensors

    sync, _ = shard_failure_run(shard_root, cache, "sync")
    background, _ = shard_failure_run(shard_root, cache, "async")
    for part in ("pretrained_model/pytorch_model_fsdp_0", "training_state/optimizer_0"):
        want = read_dcp_full(str(sync / "checkpoints" / "000002" / part))
        got = read_dcp_full(str(background / "checkpoints" / "000002" / part))
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want), part
    rng = "checkpoints/000002/training_state/rng_state.safetensors"
    (want, want_meta), (got, got_meta) = (read_safetensors(str(run / rng)) for run in (sync, background))
    assert got_meta == want_meta  # the python and numpy states: taken at step 2, not at the commit
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_async_save_commits_only_when_written_and_a_kill_mid_write_keeps_last(tmp_path, cache):
    """Step 4's background write on rank 1 waits until rank 0 has killed itself at step 5: `last` was
    still on step 2 then (not committed before the write finished), and stays there; step 4 never
    appears."""
    out = tmp_path / "run"
    args = flags(
        out, cache, "--steps=8", "--parallelism.dp_shard=2", "--checkpoint_format=dcp", "--async_save=true"
    )
    hooks = ["--hook-shard-after-signal=1:4:0", f"--hook-signal=0:5:{int(signal.SIGKILL)}"]
    killed = run_torchrun(SCRIPT, 2, *hooks, *args, check=False, timeout=300)
    assert killed.returncode != 0
    assert "hook: rank 0 sends itself signal 9 x1 at step call 5 (last -> 000002)" in killed.stdout, (
        killed.stdout
    )
    assert last(out) == "000002" and verifies(out / "checkpoints" / "last")
    assert not (out / "checkpoints" / "000004").exists()
    assert (out / "checkpoints" / ".tmp-000004").is_dir()


def test_a_config_error_under_torchrun_is_one_line_per_rank_the_main_ranks_first(tmp_path):
    """Every rank parses the flags and fails alike. Rank 0 starts 2 s late, so rank 1 reaches the error
    first: it holds its line until torchrun stops it (once rank 0 printed and exited 1), so rank 0's
    line comes first. Rank 1 prints at most its one line (none when torchrun's SIGTERM comes before it
    has parsed: it cannot know its error yet)."""
    hooks = ["--hook-delay-start=0:2.0", "--hook-tag-errors"]
    result = run_torchrun(SCRIPT, 2, *hooks, f"--output_dir={tmp_path / 'run'}", "--steps=0", check=False)
    errors = save_errors(result.stdout)
    line = "error: --steps must be >= 1, got 0 [hook: rank {}]"
    assert errors[:1] == [line.format(0)] and errors[1:] in ([], [line.format(1)]), result.stdout
    assert "exitcode  : 1" in result.stdout
    assert no_traceback_from_us(result.stdout), result.stdout
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- one writer per run


def test_second_launch_on_a_held_dir_is_refused_while_the_first_finishes(tmp_path, cache):
    """Two runs started together on one output_dir: exactly one takes the lock (and waits at its second
    step until the test lets it go); the other exits 1 with one line naming the holder and writes nothing."""
    out = tmp_path / "run"
    release = tmp_path / "release"
    args = [f"--hook-hold={release}", *flags(out, cache, "--save_freq=100")]
    runs = [
        subprocess.Popen(
            [sys.executable, str(SCRIPT), *args],
            env=launch_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        wait_for(lambda: any(run.poll() is not None for run in runs), "exit of the refused run")
        [refused] = [run for run in runs if run.poll() is not None]
        [holder] = [run for run in runs if run is not refused]
        refusal, _ = refused.communicate()
        assert refused.returncode == 1, refusal
        [error] = [line for line in refusal.splitlines() if line.startswith("error:")]
        assert error.startswith(f"error: --output_dir={out} is in use by another run: host ")
        assert f" pid {holder.pid} (started " in error
        assert "Traceback" not in refusal
        assert holder.poll() is None  # unaffected, still holding at its second step
        release.touch()
        log, _ = holder.communicate(timeout=120)
    finally:
        for run in runs:
            if run.poll() is None:
                run.kill()
    assert holder.returncode == 0, log
    assert (
        len(metrics(out, "start")) == 1 and len(metrics(out, "summary")) == 1
    )  # the refused run wrote nothing
    assert not (out / "trainer.lock").exists()


def test_ranks_stop_and_save_when_their_launcher_is_killed(tmp_path, cache):
    """`kill -9` of torchrun leaves its workers in sessions of their own: they notice the launcher's
    death, stop at one agreed step with a checkpoint, and release the lock."""
    out = tmp_path / "run"
    args = flags(out, cache, "--steps=60", "--save_freq=100", "--log_freq=1")
    log_path = tmp_path / "torchrun.log"
    with log_path.open("w") as log_file:
        launcher = subprocess.Popen(
            torchrun_command(SCRIPT, 2, "--hook-until-signalled=2", *args),
            env=launch_env(),
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    pids: list[int] = []
    try:
        wait_for(lambda: metrics_so_far(out, "train"), "first training record", process=launcher)
        pids = [int(line.split()[-1]) for line in log_path.read_text().splitlines() if " pid " in line]
        assert len(pids) == 2
        launcher.kill()
        launcher.wait()
        wait_for(lambda: not any(_alive(pid) for pid in pids), "stop of the orphaned ranks")
    finally:
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        if launcher.poll() is None:
            launcher.kill()
    log = log_path.read_text()
    assert "the launcher (pid" in log and "died: stopping" in log
    [stop] = metrics(out, "interrupted")
    assert 1 <= stop["step"] < 60
    assert last(out) == f"{stop['step']:06d}" and verifies(out / "checkpoints" / "last")
    assert not (out / "trainer.lock").exists()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for us
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False
