"""The evaluator beside a run, with real processes (docs/evaluation.md): a 2-rank FSDP2 run whose
checkpoints are scored in a deliberately slow environment while it trains, each score at its own step,
the K best kept; an evaluator whose process dies costing the run one line; and the scores landing after
a run ended logged by its evaluator, which, killed, `trainer eval --watch` resumes where it stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.engine_run import train_in
from helpers.launch import launch_env, torchrun_command
from helpers.run_outputs import metrics, model_file
from helpers.slow_env import FEATURES_MAP
from helpers.tracker_stores import trackio_logs
from helpers.train_flags import tiny_args
from helpers.waiting import wait_for
from trainer.engine import committed_step

pytestmark = pytest.mark.distributed

TESTS = Path(__file__).parents[1]
SCRIPT = Path(__file__).parent / "scripts" / "train_cli.py"
SLOW = ["--env.type=gym", "--env.task=helpers.slow_env:SlowPendulum-v0", f"--env.features_map={FEATURES_MAP}"]
ONE_EPISODE = ["--env.episode_length=20", "--eval.batch_size=1", "--eval.use_async_envs=false"]


def _env() -> dict[str, str]:
    """The launch's environment with tests/ importable (the slow environment's module)."""
    return {**launch_env(), "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}


def test_a_sharded_run_is_scored_at_every_checkpoint_while_it_trains(tmp_path) -> None:
    out = tmp_path / "run"
    gate = out / "checkpoints" / "000006"  # the slow environment holds each episode until the run's end
    flags = tiny_args(
        str(out), str(tmp_path / "cache"), "--parallelism.dp_shard=2", "--steps=6", "--save_freq=6"
    )
    flags += [*SLOW, f'--env.kwargs={{"gate": "{gate}", "gate_s": 90}}', *ONE_EPISODE, "--env_eval_freq=2"]
    flags += ["--eval.n_episodes=2", "--eval.max_episodes_rendered=1", "--eval.wait_at_end=true"]
    flags += ["--keep_last=1", "--keep_best=2", "--trackio.enable=true", "--trackio.project=evaluator-fsdp2"]
    run = subprocess.run(
        torchrun_command(SCRIPT, 2, *flags), env=_env(), capture_output=True, text=True, timeout=240
    )
    assert run.returncode == 0, run.stdout + run.stderr
    log = run.stdout + run.stderr
    assert log.count("evaluator: pid") == 1 and "FSDP2 2 (" in log

    records = metrics(out)
    trained = [i for i, r in enumerate(records) if r.get("event") == "train"]
    scores = {r["step"]: (i, r) for i, r in enumerate(records) if r.get("event") == "eval"}
    assert sorted(scores) == [2, 4, 6]  # every checkpoint the run asked for, once, at its own step
    assert all(r["n_episodes"] == 2 and "error" not in r for _, r in scores.values())
    assert min(i for i, _ in scores.values()) > trained[-1]  # step 6 trained while step 2 was scored

    ranked = sorted(scores, key=lambda s: (-scores[s][1]["avg_sum_reward"], -s))
    kept = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert kept == sorted({f"{s:06d}" for s in ranked[:2]} | {"000006", "best", "last"})
    assert os.readlink(out / "checkpoints" / "best") == f"{ranked[0]:06d}"
    for step in ranked[:2]:
        saved = json.loads((out / "checkpoints" / f"{step:06d}" / "eval.json").read_text())
        assert (
            saved["step"] == step and saved["overall"]["avg_sum_reward"] == scores[step][1]["avg_sum_reward"]
        )
        assert (out / "checkpoints" / f"{step:06d}" / "eval_videos" / "eval_episode_0.mp4").stat().st_size > 0

    config = json.loads(model_file(out, name="train_config.json").read_text())
    logged = trackio_logs("evaluator-fsdp2", config["trackio"]["run_name"])
    tracked = {row["step"]: row["eval/avg_sum_reward"] for row in logged if "eval/avg_sum_reward" in row}
    assert tracked == {s: pytest.approx(r["avg_sum_reward"]) for s, (_, r) in scores.items()}


def _evaluator_pid() -> int:
    """The pid of this process's `trainer eval --watch` child (the run's evaluator, while it runs)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and b"--watch" in cmdline:
            return int(stat.parent.name)
    raise AssertionError("the run has no evaluator process")


def _exited(pid: int) -> bool:
    """Whether the child `pid` has exited, left for its parent to reap (WNOWAIT). An exiting process's
    command line reads empty before it is a zombie: only the zombie is what the run's poll can see."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def test_an_evaluator_that_dies_costs_the_run_one_line(tmp_path, capsys, monkeypatch) -> None:
    """The environment ends the evaluator's process while it scores step 2; training is held at its
    third step until the process is gone, then goes on to the end: one warning line, no score."""
    monkeypatch.setenv("PYTHONPATH", _env()["PYTHONPATH"])
    train_step = committed_step._train_step
    calls: list[int] = []

    def held(*args, **kwargs):
        calls.append(_evaluator_pid() if not calls else calls[0])
        if len(calls) == 3:
            wait_for(lambda: _exited(calls[0]), "end of the evaluator")
        return train_step(*args, **kwargs)

    monkeypatch.setattr(committed_step, "_train_step", held)
    out = tmp_path / "run"
    flags = tiny_args(str(out), str(tmp_path / "cache"), "--steps=6", "--save_freq=6", "--env_eval_freq=2")
    train_in(tmp_path, [*flags, *SLOW, *ONE_EPISODE, '--env.kwargs={"exit_at": 1}', "--eval.n_episodes=1"])

    err = capsys.readouterr().err.replace(str(tmp_path), "TMP")
    lines = [
        line for line in err.splitlines() if "evaluator" in line and not line.startswith("evaluator: pid")
    ]
    assert len(lines) == 1 and "warning: the evaluator stopped (exit 3)" in lines[0], err
    assert "000002" in lines[0] and "the run goes on" in lines[0]
    records = metrics(out)
    assert [r["event"] for r in records].count("evaluator_lost") == 1
    assert [r["step"] for r in records if r.get("event") == "train"][-1] == 6 and records[-1][
        "event"
    ] == "summary"
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["000002", "000004", "000006", "last"]
    assert not list(out.glob("checkpoints/*/eval.json"))


def test_late_scores_are_logged_by_the_evaluator_which_resumes_after_being_killed(tmp_path, capsys) -> None:
    """A run that does not wait for its scores: its evaluator scores every checkpoint after the run
    ended (the environment is held until then) and logs each into metrics.jsonl and trackio at its
    step; killed after the first, `trainer eval --watch` goes on with the rest and scores nothing twice,
    then prunes as the run would have (--keep_last=1 --keep_best=1: the last step and the best stay)."""
    out, gate = tmp_path / "run", tmp_path / "the-run-ended"
    flags = tiny_args(str(out), str(tmp_path / "cache"), "--steps=6", "--env_eval_freq=2")
    flags += [*SLOW, *ONE_EPISODE, f'--env.kwargs={{"gate": "{gate}", "gate_s": 90, "delay_s": 0.05}}']
    flags += ["--eval.n_episodes=1", "--eval.max_episodes_rendered=0", "--eval.cpus=[0]"]
    flags += ["--trackio.enable=true", "--trackio.project=evaluator-late"]
    flags += ["--keep_last=1", "--keep_best=1", "--best_metric=avg_sum_reward"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", _env()["PYTHONPATH"])
        train_in(tmp_path, flags)
    err = capsys.readouterr().err.replace(str(tmp_path), "TMP")
    assert "steps 000002, 000004, 000006 are being scored after the run ended" in err
    assert not [r for r in metrics(out) if r.get("event") == "eval"]
    gate.touch()

    evaluator = int(err.split("evaluator: pid ")[1].split(",")[0])
    nice = int(Path(f"/proc/{evaluator}/stat").read_text().rsplit(")", 1)[1].split()[16])
    assert nice == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 10)  # below the run's ranks
    assert "Cpus_allowed_list:\t0\n" in Path(f"/proc/{evaluator}/status").read_text()  # --eval.cpus
    wait_for(lambda: "steps 000002 logged into" in (out / "evaluator.log").read_text(), "late score logged")
    os.kill(evaluator, signal.SIGKILL)
    os.waitpid(evaluator, 0)
    before = {p.parent.name: p.read_bytes() for p in out.glob("checkpoints/[0-9]*/eval.json")}
    assert "000002" in before and len(before) < 3

    watch = [
        sys.executable,
        "-m",
        "trainer.cli",
        "eval",
        f"--watch={out}",
        f"--allow_types={SLOW[1].split('=')[1]}",
    ]
    second = subprocess.run([*watch, "--json"], env=_env(), capture_output=True, text=True, timeout=180)
    assert second.returncode == 0, second.stdout + second.stderr
    assert json.loads(second.stdout.strip().splitlines()[-1])["scored"] == 3 - len(before)
    assert "the run's last step 6 is scored: the evaluator stops" in second.stderr
    after = {p.parent.name: p.read_bytes() for p in out.glob("checkpoints/[0-9]*/eval.json")}
    assert all(after[name] == data for name, data in before.items() if name in after)  # none scored twice

    scores = {r["step"]: r for r in metrics(out) if r.get("event") == "eval"}
    assert [r["step"] for r in metrics(out) if r.get("event") == "eval"] == [2, 4, 6]  # each logged once
    best = max(scores, key=lambda step: scores[step]["avg_sum_reward"])
    assert sorted(after) == sorted({"000006", f"{best:06d}"})  # the run's retention, once scored
    assert sorted(p.name for p in out.glob("checkpoints/[0-9]*")) == sorted(after)
    assert all(
        scores[int(name)]["avg_sum_reward"] == json.loads(data)["overall"]["avg_sum_reward"]
        for name, data in after.items()
    )
    config = json.loads(model_file(out, name="train_config.json").read_text())
    logged = trackio_logs("evaluator-late", config["trackio"]["run_name"])
    tracked = {row["step"]: row["eval/avg_sum_reward"] for row in logged if "eval/avg_sum_reward" in row}
    assert tracked == {s: pytest.approx(r["avg_sum_reward"]) for s, r in scores.items()}
