"""`--save_checkpoint_to_hub`: checkpoints pushed to the loopback Hub while the run trains, with the Hub
slow, failing for a while, refusing, and the trainer killed mid-push."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load

from helpers.hub_server import HubServer
from helpers.run_outputs import committed_step, metrics, metrics_so_far, model_file, saved_step
from helpers.train_flags import tiny_args
from helpers.waiting import wait_for
from trainer.cli.parse import parse_config
from trainer.engine.checkpoint import hub_pushes
from trainer.engine.plan import train
from trainer.errors import ConfigError
from trainer.evaluation.inference import load_policy

TOKEN = "hf_trainerPUSHtoken1234567890abcd"
REPO = "acme/pendulum-pushes"
PUSHES = ["--policy.type=mlp", "--save_checkpoint_to_hub=true", f"--policy.repo_id={REPO}"]
MODEL_FILES = {"model.safetensors", "config.json", "train_config.json", "README.md"}


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, clean_accelerate) -> Iterator[HubServer]:
    with HubServer() as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        monkeypatch.setattr(hub_pushes, "RETRY_DELAY_S", 0.05)
        yield server


def _assert_step_pushed(hub: HubServer, out: Path, step: str) -> None:
    """The tag of `step` names a commit holding that step's model, byte for byte, and nothing else."""
    tagged = hub.tagged(REPO, f"step-{step}")
    assert set(tagged) >= MODEL_FILES, sorted(tagged)
    assert tagged["model.safetensors"] == model_file(out, step).read_bytes()


def test_each_checkpoint_is_one_tagged_commit_pushed_while_training(
    tmp_path, dataset_cache, hub, capsys
) -> None:
    out = tmp_path / "run"
    train(parse_config(tiny_args(str(out), dataset_cache, *PUSHES, "--push_training_state=true")))

    repo = hub.repo(REPO)
    assert [c.summary for c in repo.commits] == [
        "Checkpoint at step 000002 (model weights), pushed while training",
        "Checkpoint at step 000004 (model weights), pushed while training",
    ]
    assert set(repo.tags) == {"step-000002", "step-000004"}
    for step in ("000002", "000004"):
        _assert_step_pushed(hub, out, step)
        tagged = hub.tagged(REPO, f"step-{step}")
        step_json = (saved_step(out, step) / "training_state" / "training_step.json").read_bytes()
        assert tagged["training_state/training_step.json"] == step_json  # --push_training_state
    assert [r["tag"] for r in metrics(out, "hub_push")] == ["step-000002", "step-000004"]
    downloaded = tmp_path / "step-000002"  # what `hf download REPO --revision step-000002` gives
    for name, data in hub.tagged(REPO, "step-000002").items():
        (downloaded / name).parent.mkdir(parents=True, exist_ok=True)
        (downloaded / name).write_bytes(data)
    policy = load_policy(str(downloaded)).policy.state_dict()
    saved = load(model_file(out, 2).read_bytes())
    assert set(policy) == set(saved) and all(torch.equal(policy[k], saved[k]) for k in saved)
    err = capsys.readouterr().err
    assert f"pushed step 000004 (model weights) to {REPO} as step-000004" in err
    assert "warning" not in err and TOKEN not in err


def test_without_training_state_only_the_model_is_pushed(tmp_path, dataset_cache, hub) -> None:
    out = tmp_path / "run"
    train(parse_config(tiny_args(str(out), dataset_cache, *PUSHES, "--steps=2")))
    assert not any(name.startswith("training_state/") for name in hub.files(REPO))
    _assert_step_pushed(hub, out, "000002")


def test_a_slow_hub_skips_a_waiting_step_and_retention_keeps_the_one_in_flight(
    tmp_path, dataset_cache, hub, capsys
) -> None:
    """Step 2's push is held until steps 4 and 6 are saved: 4 waits, 6 replaces it (one line says so),
    and --keep_last=1 does not delete step 2 under its push. The hold ends at that line, not after a
    time a busy machine could outlast."""
    out = tmp_path / "run"
    hub.hold("preupload", after_commits=0)
    release = threading.Thread(target=_release_when_skipped, args=(hub, out), daemon=True)
    release.start()
    train(parse_config(tiny_args(str(out), dataset_cache, *PUSHES, "--steps=6", "--keep_last=1")))
    release.join()

    assert set(hub.repo(REPO).tags) == {"step-000002", "step-000006"}
    _assert_step_pushed(hub, out, "000002")  # retention spared it while it was pushed
    _assert_step_pushed(hub, out, "000006")
    err = capsys.readouterr().err
    assert "not pushing step 000004: step 000006 is newer and step 000002 is still uploading" in err
    assert not saved_step(out, 4).exists()  # nothing pinned it: retention went on


def _release_when_skipped(hub: HubServer, out: Path) -> None:
    """End the hold of step 2's push once the run has said which waiting step it skipped (or, failing
    that, at the deadline: the run then ends and the test fails on what it asserts)."""
    try:
        wait_for(lambda: metrics_so_far(out, "hub_push_skipped"), "skipped push")
    finally:
        hub.slow("preupload", 0.0)


def test_transient_failures_are_retried(tmp_path, dataset_cache, hub, capsys) -> None:
    hub.fail_next("commit", 2)
    out = tmp_path / "run"
    train(parse_config(tiny_args(str(out), dataset_cache, *PUSHES)))
    assert set(hub.repo(REPO).tags) == {"step-000002", "step-000004"}
    assert [r["attempt"] for r in metrics(out, "hub_push_retry")] == [1, 2]
    assert "warning" not in capsys.readouterr().err


def test_a_hub_that_keeps_failing_warns_once_and_training_goes_on(
    tmp_path, dataset_cache, hub, capsys
) -> None:
    hub.fail("commit", 503)
    out = tmp_path / "run"
    summary = train(parse_config(tiny_args(str(out), dataset_cache, *PUSHES)))

    assert summary.steps == 4 and not hub.repo(REPO).commits
    err = capsys.readouterr().err
    assert err.count("warning: pushing") == 1 and "hub_push_failed" not in err  # later ones: records only
    assert "pushing step 000002 to acme/pendulum-pushes failed: Hub server error (HTTP 503)" in err
    assert "training goes on, later steps are still pushed" in err
    assert "2 checkpoint push(es) to acme/pendulum-pushes failed (steps 000002, 000004)" in err
    assert [r["step_dir"][-6:] for r in metrics(out, "hub_push_failed")] == ["000002", "000004"]
    assert hub.routes().count("commit") == 2 * hub_pushes.PUSH_ATTEMPTS
    assert model_file(out, 4).is_file()


def test_a_refusal_stops_the_pushes_after_one_attempt(tmp_path, dataset_cache, hub, capsys) -> None:
    hub.fail("commit", 403)
    out = tmp_path / "run"
    train(parse_config(tiny_args(str(out), dataset_cache, *PUSHES)))
    err = capsys.readouterr().err
    assert "not authorized" in err and "later steps are not pushed" in err
    assert hub.routes().count("commit") == 1  # no retry of a refusal, no push of step 4


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--save_checkpoint_to_hub=true"],
            "--save_checkpoint_to_hub=true needs the Hub repo: add --policy.repo_id",
        ),
        (
            ["--save_checkpoint_to_hub=true", "--policy.repo_id=s3://bucket/run"],
            "--save_checkpoint_to_hub=true pushes to a Hub repo, and --policy.repo_id=s3://bucket/run is a path or URL",
        ),
        (
            ["--push_training_state=true"],
            "--push_training_state=true applies to the pushes of --save_checkpoint_to_hub",
        ),
    ],
)
def test_bad_push_flags_are_refused_before_training(flags, message) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(flags)
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


def test_a_kill_mid_push_leaves_a_consistent_repo_and_the_resumed_run_pushes_on(
    tmp_path, dataset_cache, hub
) -> None:
    """SIGKILL while a push after step 2's uploads its files and step 6, the last, is committed: the
    repo still holds step 2's complete commit and nothing half-made; the resumed run pushes the step it
    resumes from (never pushed) and the steps after it.

    The kill waits for both states, whatever the machine's speed: the uploads after step 2's are held
    (a fast machine has saved step 6 before step 2 is pushed, a slow one is still training), and the
    resumed run starts from step 6 only if step 6 was committed before the kill."""
    out = tmp_path / "run"
    args = tiny_args(str(out), dataset_cache, *PUSHES, "--steps=6")
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_TOKEN": TOKEN}
    command = [sys.executable, "-m", "trainer.cli", "train", *args]
    hub.hold("lfs_upload", after_commits=1)  # step 2's files upload; the next push stalls in its upload
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: hub.held("lfs_upload"), "upload after step 2's commit", process=process)
        wait_for(lambda: committed_step(out) == 6, "commit of step 6", process=process)
        process.send_signal(signal.SIGKILL)
    finally:
        process.kill()
        process.wait(timeout=60)
    hub.slow("lfs_upload", 0.0)

    repo = hub.repo(REPO)
    assert [c.summary[:27] for c in repo.commits] == ["Checkpoint at step 000002 ("]
    assert set(repo.tags) == {"step-000002"} and hub.files(REPO) == hub.tagged(REPO, "step-000002")
    _assert_step_pushed(hub, out, "000002")

    resumed = subprocess.run(
        [*command, "--resume=true", "--steps=8"], env=env, capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "pushing step 000006, which this run resumes from" in resumed.stderr
    assert set(hub.repo(REPO).tags) == {"step-000002", "step-000006", "step-000008"}
    for step in ("000006", "000008"):
        _assert_step_pushed(hub, out, step)
    assert hub.files(REPO) == hub.tagged(REPO, "step-000008")
