"""Experiment tracking, offline: W&B's offline run directory and trackio's local store receive the
config, every metric and the summary from one run, and a resumed run continues the same tracker run."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

from helpers.lerobot_data import write_dataset
from helpers.tracker_stores import trackio_config, trackio_logs, wandb_offline_runs
from helpers.train_flags import TINY_LEROBOT_ACT, tiny_args
from trainer.cli.parse import parse_config
from trainer.engine.plan import run_wandb_mode, train
from trainer.errors import ConfigError
from trainer.policies import PolicyConfig
from trainer.reporting import trackers
from trainer.reporting.loss_curve import read_history

METRICS = {"loss", "grad_norm", "lr", "samples_per_s", "epoch"}


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Nothing may reach the network: W&B offline with every directory under tmp_path, no key."""
    for name in ("WANDB_API_KEY", "WANDB_BASE_URL", "TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    for name in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    yield
    if "wandb" in sys.modules:  # stop the wandb-core service a test started
        sys.modules["wandb"].teardown()


def test_both_trackers_log_everything_and_a_resumed_run_continues_them(
    tmp_path, dataset_cache, clean_accelerate, offline, capsys
) -> None:
    out = tmp_path / "run"
    project = f"tracking-{tmp_path.name}"
    enable = [
        "--wandb.enable=true",
        "--wandb.mode=offline",
        "--wandb.project=demo",
        "--wandb.notes=tiny run",
        "--trackio.enable=true",
        f"--trackio.project={project}",
    ]
    first = train(parse_config(tiny_args(str(out), dataset_cache, "--policy.type=mlp", *enable)))
    clean_accelerate_between_runs()
    second = train(parse_config([f"--output_dir={out}", "--resume=true", "--steps=6"]))
    # the resumed segment's summary and curve cover the whole run (metrics.jsonl)
    assert second.first_loss == first.first_loss
    history = read_history(out / "metrics.jsonl")
    assert [s for s, _ in history.loss] == [2, 4, 6] and history.resumes == [4]
    assert (out / "loss_curve.png").stat().st_size > 0

    assert "warning: wandb" not in capsys.readouterr().err
    import wandb

    wandb.teardown()  # every record flushed to the offline files before they are read
    runs = wandb_offline_runs(out)
    assert len(runs) == 2 and runs[0].run_id == runs[1].run_id  # one W&B run, continued
    assert runs[0].config["steps"] == 4 and runs[0].config["wandb"]["notes"] == "tiny run"
    steps = [row["_step"] for run in runs for row in run.history]
    assert steps == [2, 4, 6]
    for row in (row for run in runs for row in run.history):
        assert row.keys() >= METRICS and all(math.isfinite(row[k]) for k in METRICS)
    assert runs[0].summary["final_loss"] == pytest.approx(first.final_loss)
    assert "policy_return" in runs[1].summary

    from trackio.sqlite_storage import SQLiteStorage

    names = SQLiteStorage.get_runs(project)
    assert len(names) == 1  # the resumed run continued the first one
    logs = trackio_logs(project, names[0])
    train_rows = [row for row in logs if "loss" in row]
    assert [row["step"] for row in train_rows] == [2, 4, 6]
    assert all(row.keys() >= METRICS for row in train_rows)
    assert any("summary/final_loss" in row for row in logs)
    assert trackio_config(project, names[0])["steps"] in (4, 6)


def test_what_acts_forward_reports_is_logged_as_the_policy_computed_it(
    tmp_path, clean_accelerate, offline, monkeypatch
) -> None:
    """ACT's `l1_loss` and `kld_loss` (LeRobot's names) reach metrics.jsonl's train records, each the
    mean of what the policy's forward returned over the log window, the held-out records (`val_l1_loss`:
    ACT's CVAE is off in eval mode, so no KL there), W&B and trackio."""
    policy_class = PolicyConfig.get_choice_class("act")().policy_class()
    reported: list[tuple[bool, int, dict[str, float]]] = []  # (training, frames, metrics) per forward
    forward = policy_class.forward

    def recording(self, batch):  # type: ignore[no-untyped-def]
        loss, metrics = forward(self, batch)
        frames = len(next(iter(batch.values())))
        reported.append((self.training, frames, {name: value.item() for name, value in metrics.items()}))
        return loss, metrics

    monkeypatch.setattr(policy_class, "forward", recording)
    write_dataset(tmp_path / "ds", [20, 20, 20], rows_per_file=30)
    project = f"policy-metrics-{tmp_path.name}"
    flags = [f"--dataset.root={tmp_path / 'ds'}", "--dataset.val_episodes=[2]", "--policy.type=act"]
    flags += [*TINY_LEROBOT_ACT, "--policy.input_features=[observation.state]", "--num_workers=0"]
    flags += ["--batch_size=4", "--steps=4", "--log_freq=2", "--save_freq=4", "--eval_freq=2"]
    flags += ["--wandb.enable=true", "--wandb.mode=offline", "--wandb.project=demo"]
    flags += ["--trackio.enable=true", f"--trackio.project={project}", f"--output_dir={tmp_path / 'run'}"]
    train(parse_config(flags))

    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    trained = [metrics for training, _, metrics in reported if training]
    assert len(trained) == 4 and all(metrics.keys() == {"l1_loss", "kld_loss"} for metrics in trained)
    logged = [record for record in records if record.get("event") == "train"]
    assert [record["step"] for record in logged] == [2, 4]
    for record, window in zip(logged, (trained[:2], trained[2:]), strict=True):
        for name in ("l1_loss", "kld_loss"):  # the float32 running sum over the window, then its mean
            expected = (torch.tensor(window[0][name]) + torch.tensor(window[1][name])) / 2
            assert record[name] == expected.item(), name

    held_out = [(frames, metrics) for training, frames, metrics in reported if not training]
    per_eval = len(held_out) // 2  # two evaluations (steps 2 and 4), the same batches each time
    assert len(held_out) == 2 * per_eval and all(metrics.keys() == {"l1_loss"} for _, metrics in held_out)
    val = [record for record in records if record.get("event") == "val"]
    assert [record["step"] for record in val] == [2, 4]
    for record, batches in zip(val, (held_out[:per_eval], held_out[per_eval:]), strict=True):
        mean = sum(m["l1_loss"] * n for n, m in batches) / sum(n for n, _ in batches)
        assert record["val_l1_loss"] == pytest.approx(mean, rel=1e-12) and "val_kld_loss" not in record

    import wandb

    wandb.teardown()  # every record flushed to the offline files before they are read
    (run,) = wandb_offline_runs(tmp_path / "run")
    rows = {(row["_step"], name): row[name] for row in run.history for name in row}
    from trackio.sqlite_storage import SQLiteStorage

    (name,) = SQLiteStorage.get_runs(project)
    trackio_rows = {(row["step"], key): row[key] for row in trackio_logs(project, name) for key in row}
    for record in logged:
        for key in ("l1_loss", "kld_loss"):
            assert rows[record["step"], key] == trackio_rows[record["step"], key] == record[key]
    for record in val:
        assert rows[record["step"], "val_l1_loss"] == trackio_rows[record["step"], "val_l1_loss"]
        assert rows[record["step"], "val_l1_loss"] == record["val_l1_loss"]


def _check_trackers(config) -> None:
    """The run plan's tracker check on a parsed config."""
    trackers.check_trackers(config.wandb, config.trackio, run_wandb_mode(config))


def test_missing_credentials_and_library_are_one_line_at_start(tmp_path, offline, monkeypatch) -> None:
    monkeypatch.delenv("WANDB_MODE")  # online: the config's default
    config = parse_config(["--wandb.enable=true", f"--output_dir={tmp_path}"])  # online by default
    with pytest.raises(ConfigError, match=r"--wandb.mode=online needs W&B credentials: set WANDB_API_KEY"):
        _check_trackers(config)
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    _check_trackers(config)
    monkeypatch.setattr(trackers.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"--trackio.enable=true needs the trackio package: pip install"):
        _check_trackers(parse_config(["--trackio.enable=true"]))


def test_the_cli_refuses_in_one_line_before_any_work(tmp_path, offline, capsys, monkeypatch) -> None:
    from trainer.cli import main

    monkeypatch.delenv("WANDB_MODE")

    out = tmp_path / "never-created"
    with pytest.raises(SystemExit) as info:
        main(["train", "--wandb.enable=true", "--wandb.project=p", f"--output_dir={out}"])
    assert info.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --wandb.mode=online needs W&B credentials")
    assert not out.exists()  # nothing was built, loaded or written


@pytest.mark.parametrize(
    ("env", "flags", "refused"),
    [
        ({"WANDB_MODE": "offline"}, [], False),
        ({"WANDB_MODE": "disabled"}, [], False),
        ({"WANDB_MODE": "dryrun"}, [], False),
        ({"WANDB_DISABLED": "true"}, [], False),
        ({"WANDB_IDENTITY_TOKEN_FILE": "/run/token"}, [], False),
        ({"WANDB_MODE": "offline"}, ["--wandb.mode=online"], True),  # the flag wins, as in wandb.init
        ({}, [], True),
    ],
)
def test_the_credentials_check_honours_the_w_and_b_environment(
    tmp_path, offline, monkeypatch, env, flags, refused
) -> None:
    """WANDB_MODE=offline/disabled (and W&B's other variables) need no key; the mode checked is the
    mode `wandb.init` gets."""
    monkeypatch.delenv("WANDB_MODE")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    config = parse_config(["--wandb.enable=true", f"--output_dir={tmp_path}", *flags])
    if refused:
        with pytest.raises(ConfigError, match="needs W&B credentials"):
            _check_trackers(config)
    else:
        _check_trackers(config)


class _Recorder:
    name = "recorder"

    def __init__(self) -> None:
        self.logged: list[tuple[dict, int]] = []
        self.summaries: list[dict] = []

    def log(self, metrics, step):  # type: ignore[no-untyped-def]
        self.logged.append((metrics, step))

    def summary(self, values, step):  # type: ignore[no-untyped-def]
        self.summaries.append(values)

    def finish(self) -> None:
        pass


def test_the_logger_forwards_training_and_validation_metrics_and_the_summary(tmp_path) -> None:
    from trainer.reporting.metrics import MetricsLogger

    logger = MetricsLogger(str(tmp_path), total_steps=4, start_step=0)
    recorder = _Recorder()
    logger.trackers = trackers.GuardedTrackers([recorder], print)
    logger.log({"step": 2, "loss": 0.5, "grad_norm": 1.5, "lr": 1e-3, "samples_per_s": 80.0, "epoch": 0})
    logger.note("step 2 val_loss=0.6", event="val", step=2, val_loss=0.6)
    logger.note("resuming", event="resume", step=2, changes=[])
    logger.note("done", event="summary", steps=4, final_loss=0.4, last_checkpoint="x")
    assert recorder.logged == [
        ({"loss": 0.5, "grad_norm": 1.5, "lr": 1e-3, "samples_per_s": 80.0, "epoch": 0}, 2),
        ({"val_loss": 0.6}, 2),
    ]
    assert recorder.summaries == [{"steps": 4, "final_loss": 0.4}]
    logger.close()


class _Broken:
    name = "wandb"

    def log(self, metrics, step):  # type: ignore[no-untyped-def]
        raise ConnectionError("api.wandb.ai unreachable")

    summary = finish = log


def test_a_failing_tracker_warns_once_and_training_goes_on() -> None:
    warnings: list[str] = []
    guarded = trackers.GuardedTrackers([_Broken()], warnings.append)
    for step in (1, 2):
        guarded.log({"step": step, "loss": 0.5})
    guarded.summary({"steps": 2, "final_loss": 0.5})
    guarded.finish()
    assert warnings == [
        "warning: wandb logging failed (ConnectionError: api.wandb.ai unreachable): training continues without it"
    ]


def clean_accelerate_between_runs() -> None:
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
