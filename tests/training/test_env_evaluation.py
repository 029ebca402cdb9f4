"""Policies scored in their environments, one checkpoint at a time (docs/evaluation.md): LeRobot's env
configs and flags, lerobot-eval's figures and videos in eval.json, and an environment that crashes,
hangs or returns NaN costing one line and that score only."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import av
import draccus
import pytest

import ckpt_tools
from helpers.engine_run import train_in
from helpers.fixtures import copy_fixture, fixture_dir
from helpers.lerobot_data import write_dataset
from helpers.point_env import FEATURES_MAP as POINT_FEATURES
from helpers.slow_env import FEATURES_MAP
from helpers.train_flags import tiny_args
from trainer.cli import main
from trainer.cli.parse import parse_config
from trainer.config.environment import AlohaEnv, EnvEvalConfig, PushtEnv
from trainer.engine.plan import env_evaluation
from trainer.errors import ConfigError
from trainer.evaluation.env_scores import EnvScoring, score_step
from trainer.evaluation.evaluator import score_line

LEROBOT = json.loads((fixture_dir("lerobot_env_configs") / "env_configs.json").read_text())
SLOW = ["--env.type=gym", "--env.task=helpers.slow_env:SlowPendulum-v0", f"--env.features_map={FEATURES_MAP}"]
# The point-mass task the ACT LeRobot wrote (tests/fixtures/lerobot/checkpoint_act) reads, two short episodes
POINT = [
    "--env.type=gym",
    "--env.task=helpers.point_env:PointPush-v0",
    f"--env.features_map={POINT_FEATURES}",
    "--env.episode_length=4",
    "--eval.n_episodes=2",
    "--eval.batch_size=1",
    "--eval.use_async_envs=false",
    "--eval.max_episodes_rendered=0",
]


def test_env_configs_are_lerobots_field_for_field() -> None:
    """PushT and ALOHA as lerobot-train 0.6.1 writes them into train_config.json: every field, default,
    feature shape and feature name; and --eval.* with LeRobot's defaults."""
    for name, config in (("pusht", PushtEnv()), ("aloha", AlohaEnv())):
        ours = draccus.encode(config)
        assert {key: ours[key] for key in LEROBOT["env"][name]} == LEROBOT["env"][name], name
    ours = draccus.encode(EnvEvalConfig())
    assert {key: ours[key] for key in LEROBOT["eval"]} == LEROBOT["eval"]


def test_lerobots_env_flags_parse_into_the_run() -> None:
    config = parse_config(
        ["--env.type=pusht", "--env_eval_freq=500", "--eval.n_episodes=10", "--eval.batch_size=5"]
    )
    assert (config.env.type, config.env.gym_id, config.env_eval_freq) == ("pusht", "gym_pusht/PushT-v0", 500)
    assert (config.eval.environments(), config.run_name) == (5, "pusht_act_state")
    assert parse_config(["--env.type=pendulum", "--env.camera=true"]).env.features["pixels/top"].shape == (
        32,
        32,
        3,
    )


def test_eval_cpus_the_machine_lacks_are_refused_at_start() -> None:
    config = parse_config(["--env.type=pendulum", "--env_eval_freq=2", "--eval.cpus=[0,4096]"])
    with pytest.raises(
        ConfigError, match=r"--eval.cpus=\[0, 4096\]: this machine has no core 4096 \(cores 0-"
    ):
        env_evaluation(config)


@pytest.fixture(scope="module")
def pendulum_step(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny MLP trained on the pendulum: its last step."""
    root = tmp_path_factory.mktemp("pendulum_policy")
    train_in(root, tiny_args(str(root / "run"), str(root / "cache"), "--policy.type=mlp", "--save_freq=4"))
    return root / "run" / "checkpoints" / "000004"


@pytest.mark.parametrize(
    ("kwargs", "limit", "why"),
    [
        ({"crash_at": 3}, 60.0, "RuntimeError: the simulator lost its contact solver"),
        ({"nan_at": 2}, 60.0, "the environment returned a NaN or infinite reward"),
        ({"gate": "/nonexistent", "gate_s": 30.0}, 0.5, "took longer than --eval.episode_time_limit_s=0.5"),
        (
            {"start_s": 30.0},
            0.5,
            "starting the environments took longer than --eval.episode_time_limit_s=0.5",
        ),
    ],
    ids=["crash", "nan", "hang", "hang-at-start"],
)
def test_a_failing_environment_costs_one_line_and_that_score(
    pendulum_step, tmp_path, kwargs, limit, why
) -> None:
    env = parse_config([*SLOW, f"--env.kwargs={json.dumps(kwargs)}"]).env
    settings = EnvEvalConfig(n_episodes=2, batch_size=1, use_async_envs=False, episode_time_limit_s=limit)
    record = score_step(str(pendulum_step), EnvScoring(env, settings, 0, {}), "cpu", ())
    assert why in record["error"] and "\n" not in record["error"] and "overall" not in record
    assert ckpt_tools.read_scores(str(pendulum_step)) == record  # written: a follower never retries it
    assert score_line(record).startswith("step 4: evaluation in gym failed, score lost: ")


def test_pusht_scores_a_trained_checkpoint_into_eval_json_and_mp4(tmp_path, capsys) -> None:
    """LeRobot's PushT (gym-pusht) scoring a tiny policy trained on a 2-D feature, renamed onto PushT's
    agent position: lerobot-eval's figures per episode and overall, and an H.264 video of episode 0."""
    pytest.importorskip("gym_pusht", reason="the [pusht] extra is part of the tests session")
    write_dataset(tmp_path / "data", [20, 20])
    train_in(
        tmp_path,
        [
            f"--dataset.root={tmp_path / 'data'}",
            "--policy.type=mlp",
            "--policy.input_features=[observation.velocity]",
            f"--output_dir={tmp_path / 'run'}",
            "--steps=2",
            "--save_freq=2",
            "--batch_size=4",
            "--num_workers=0",
        ],
    )
    step = tmp_path / "run" / "checkpoints" / "last"
    flags = ["--env.type=pusht", "--env.episode_length=12", "--eval.n_episodes=2", "--eval.batch_size=2"]
    rename = '--rename_map={"observation.state": "observation.velocity"}'
    with pytest.raises(SystemExit) as exit_code:
        main(["eval", f"--policy.path={step}", *flags, rename, "--eval.max_episodes_rendered=1", "--json"])
    assert exit_code.value.code == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    saved = json.loads((tmp_path / "run" / "checkpoints" / "000002" / "eval.json").read_text())
    assert saved == printed and (saved["step"], saved["env"], saved["weights"]) == (2, "pusht", "model")
    assert [e["seed"] for e in saved["per_episode"]] == [1000, 1001]
    sums = [e["sum_reward"] for e in saved["per_episode"]]
    assert saved["overall"]["avg_sum_reward"] == pytest.approx(sum(sums) / 2)
    assert saved["per_task"][0]["metrics"]["sum_rewards"] == sums
    assert saved["overall"]["video_paths"] == ["eval_videos/eval_episode_0.mp4"]
    with av.open(str(step / "eval_videos" / "eval_episode_0.mp4")) as video:
        stream = video.streams.video[0]
        frames = sum(1 for _ in video.decode(stream))
        assert (stream.codec_context.name, stream.width, stream.average_rate) == ("h264", 384, 10)
    assert frames == 13  # the reset and every step of the 12-step episode


def test_an_environment_the_policy_cannot_read_is_one_line(pendulum_step, capsys) -> None:
    unmapped = ["--env.type=gym", SLOW[1], '--env.features_map={"agent_pos": "observation.other"}']
    with pytest.raises(SystemExit) as exit_code:
        main(["eval", f"--policy.path={pendulum_step}", *unmapped])
    err = capsys.readouterr().err.strip()
    assert exit_code.value.code == 1 and "\n" not in err
    assert "the policy reads 'observation.state', which --env.type=gym gives no value for" in err


@pytest.mark.parametrize(
    ("flags", "why"),
    [
        ([], "scores its checkpoints in no environment: give one, e.g. --env.type=pusht"),
        ([*SLOW, "--eval.wait_at_end=true"], "--eval.wait_at_end is the training run's"),
    ],
    ids=["no-environment", "run-only-flag"],
)
def test_watch_refuses_what_it_cannot_act_on_in_one_line(pendulum_step, capsys, flags, why) -> None:
    """A run that scores in no environment, with none given, is refused at once (not followed for
    --idle_timeout_s); a flag only a training run acts on is refused, not ignored."""
    with pytest.raises(SystemExit) as exit_code:
        main(["eval", f"--watch={pendulum_step.parents[1]}", *flags])
    err = capsys.readouterr().err.strip()
    assert exit_code.value.code == 1 and "\n" not in err and why in err, err


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_any_pretrained_model_scores_where_lerobot_eval_writes(tmp_path, monkeypatch, capsys) -> None:
    """lerobot-eval's `--policy.path` without a step around it: a LeRobot run's `pretrained_model/` copied
    alone, the same files under another name (a Hub download), and the LeRobot run's own step, which is
    left untouched. Each scores without --output_dir into lerobot-eval's default,
    outputs/eval/<date>/<time>_<job_name>/eval_info.json under the working directory: the same policy on
    the same seeds, the same figures."""
    run = copy_fixture(tmp_path, "lerobot", "checkpoint_act")
    model = run / "checkpoints" / "000004" / "pretrained_model"
    alone = Path(shutil.copytree(model, tmp_path / "alone" / "pretrained_model"))
    download = Path(shutil.copytree(model, tmp_path / "act_download"))
    before = _files(run)
    monkeypatch.chdir(tmp_path / "alone")  # the run's directory is nowhere near
    records = {}
    for path, job in ((alone, []), (download, ["--job_name=hub"]), (model, ["--job_name=lerobot_run"])):
        with pytest.raises(SystemExit) as exit_code:
            main(["eval", f"--policy.path={path}", *POINT, *job, "--json"])
        assert exit_code.value.code == 0
        captured = capsys.readouterr()
        printed = json.loads(captured.out.strip().splitlines()[-1])
        name = job[0].split("=")[1] if job else "gym_act"  # lerobot-eval's job: <env type>_<policy type>
        [written] = (tmp_path / "alone" / "outputs" / "eval").glob(f"*/*_{name}/eval_info.json")
        relative = written.parent.relative_to(tmp_path / "alone" / "outputs" / "eval")
        assert re.fullmatch(rf"\d{{4}}-\d\d-\d\d/\d\d-\d\d-\d\d_{name}", str(relative))
        assert json.loads(written.read_text()) == printed and str(relative) in captured.err
        assert (printed["weights"], [e["seed"] for e in printed["per_episode"]]) == ("model", [1000, 1001])
        records[name] = {k: v for k, v in printed["overall"].items() if not k.startswith("eval_")}
    assert records["gym_act"] == records["hub"] == records["lerobot_run"]
    assert _files(run) == before  # a LeRobot run's step is read, never written into


def test_scores_landing_after_the_run_prune_as_the_run_would_have(tmp_path, capsys) -> None:
    """Steps scored after their run ended (its evaluator, or `trainer eval --watch`, here standalone on a
    finished run) leave exactly what the run's retention keeps: the --keep_last newest and --keep_best's
    best by the scores the evaluator logged, not every step it scored."""
    out = tmp_path / "run"
    train_in(tmp_path, tiny_args(str(out), str(tmp_path / "cache"), "--policy.type=mlp", "--steps=6"))
    assert sorted(p.name for p in out.glob("checkpoints/[0-9]*")) == ["000002", "000004", "000006"]
    episodes = ["--env.episode_length=5", "--eval.n_episodes=1", "--eval.max_episodes_rendered=0"]
    retention = ["--keep_last=1", "--keep_best=1", "--best_metric=avg_sum_reward"]
    with pytest.raises(SystemExit) as exit_code:
        main(["eval", f"--watch={out}", *SLOW, *episodes, "--env_eval_freq=2", *retention, "--json"])
    assert exit_code.value.code == 0 and json.loads(capsys.readouterr().out)["scored"] == 3
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    scores = {r["step"]: r["avg_sum_reward"] for r in records if r.get("event") == "eval"}
    best = max(scores, key=lambda step: scores[step])
    assert sorted(scores) == [2, 4, 6]
    assert sorted(int(p.name) for p in out.glob("checkpoints/[0-9]*")) == sorted({6, best})
