"""The evaluator beside a run, with real processes (docs/evaluation.md): a 2-rank FSDP2 run whose
checkpoints are scored in a deliberately slow environment while it trains, each score at its own step,
the K best kept; and `trainer eval --watch` following a run, killed, and resumed where it stopped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.engine_run import train_in
from helpers.launch import launch_env, torchrun_command
from helpers.slow_env import FEATURES_MAP
from helpers.tracker_stores import trackio_logs
from helpers.train_flags import tiny_args

pytestmark = pytest.mark.distributed

TESTS = Path(__file__).parents[1]
SCRIPT = Path(__file__).parent / "scripts" / "train_cli.py"
SLOW = ["--env.type=gym", "--env.task=helpers.slow_env:SlowPendulum-v0", f"--env.features_map={FEATURES_MAP}"]
ONE_EPISODE = ["--env.episode_length=20", "--eval.batch_size=1", "--eval.use_async_envs=false"]


def _env() -> dict[str, str]:
    """The launch's environment with tests/ importable (the slow environment's module)."""
    return {**launch_env(), "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


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

    records = _records(out)
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

    config = json.loads((out / "checkpoints" / "last" / "pretrained_model" / "train_config.json").read_text())
    logged = trackio_logs("evaluator-fsdp2", config["trackio"]["run_name"])
    tracked = {row["step"]: row["eval/avg_sum_reward"] for row in logged if "eval/avg_sum_reward" in row}
    assert tracked == {s: pytest.approx(r["avg_sum_reward"]) for s, (_, r) in scores.items()}


def test_watch_follows_a_run_and_resumes_after_being_killed(tmp_path) -> None:
    out = tmp_path / "run"
    watch = [sys.executable, "-m", "trainer.cli", "eval", f"--watch={out}", *SLOW, *ONE_EPISODE]
    watch += ['--env.kwargs={"delay_s": 0.05}', "--eval.n_episodes=1", "--eval.max_episodes_rendered=0"]
    first = subprocess.Popen(watch, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        train_in(tmp_path, tiny_args(str(out), str(tmp_path / "cache"), "--steps=6", "--save_freq=2"))
        deadline = time.monotonic() + 90
        while not (out / "checkpoints" / "000002" / "eval.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        first.kill()
        first.wait(timeout=30)
    before = {p.parent.name: p.read_bytes() for p in out.glob("checkpoints/[0-9]*/eval.json")}
    assert "000002" in before and len(before) < 3

    second = subprocess.run([*watch, "--json"], env=_env(), capture_output=True, text=True, timeout=180)
    assert second.returncode == 0, second.stdout + second.stderr
    assert json.loads(second.stdout.strip().splitlines()[-1])["scored"] == 3 - len(before)
    assert "the run's last step 6 is scored: the evaluator stops" in second.stderr
    after = {p.parent.name: p.read_bytes() for p in out.glob("checkpoints/[0-9]*/eval.json")}
    assert sorted(after) == ["000002", "000004", "000006"]
    assert all(after[name] == data for name, data in before.items())  # nothing scored twice
    assert all(json.loads(data)["overall"]["n_episodes"] == 1 for data in after.values())
