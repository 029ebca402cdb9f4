"""End-of-training publish in one process: `--policy.push_to_hub=true --policy.repo_id=...` against
the loopback Hub server, with the endpoint and token from HF_ENDPOINT / HF_TOKEN as a user sets them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from huggingface_hub import ModelCard

import ckpt_tools
from helpers.hub_server import HubServer
from helpers.run_outputs import metrics, model_file
from helpers.train_flags import tiny_args
from trainer.cli import main as cli_main
from trainer.cli.parse import parse_config
from trainer.engine.plan import train
from trainer.errors import ConfigError, PublishFailedError

TOKEN = "hf_trainerLOOPBACKtoken0987654321"
REPO = "acme/pendulum-mlp"
PUSH = ["--policy.type=mlp", "--steps=2", "--policy.push_to_hub=true", f"--policy.repo_id={REPO}"]


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, clean_accelerate) -> Iterator[HubServer]:
    """The loopback Hub, reached the way a user points the trainer at a Hub: HF_ENDPOINT and HF_TOKEN.
    (Depends on clean_accelerate so these variables are set after it saved the environment.)"""
    with HubServer() as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        yield server


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_the_final_checkpoint_is_published_in_one_commit(tmp_path, dataset_cache, hub, capsys) -> None:
    out = tmp_path / "run"
    card_flags = ["--policy.license=mit", '--policy.tags=["pendulum"]']  # LeRobot's model card fields
    summary = train(parse_config(tiny_args(str(out), dataset_cache, *PUSH, *card_flags)))

    model_dir = Path(summary.last_checkpoint) / "pretrained_model"
    arrived = hub.files(REPO)
    assert len(hub.repo(REPO).commits) == 1 and hub.routes().count("commit") == 1
    local_names = {p.name for p in model_dir.iterdir()}
    processor_files = {
        n for n in local_names if n.startswith(("policy_preprocessor", "policy_postprocessor"))
    }
    assert len(processor_files) >= 2
    assert (
        set(arrived)
        == {"model.safetensors", "config.json", "train_config.json", "README.md"} | processor_files
    )
    for name in set(arrived) - {"README.md"}:
        assert arrived[name] == (model_dir / name).read_bytes(), name
    assert not any(n.startswith("training_state") or n.endswith(".distcp") for n in arrived)

    card = ModelCard(arrived["README.md"].decode())
    assert card.data.library_name == "ckpt-tools" and {"mlp", "pendulum"} <= set(card.data.tags)
    assert card.data.license == "mit"
    assert f"| Final loss | {summary.final_loss:.6g} |" in card.text
    assert "| Steps | 2 |" in card.text and "1 ranks" in card.text
    assert summary.episodes == 0 and "Evaluation return" not in card.text  # no rollouts, no returns

    # the publish settings round-trip in train_config.json (a resume publishes too), not in config.json
    train_config = json.loads(arrived["train_config.json"])
    assert train_config["policy"]["push_to_hub"] is True and train_config["policy"]["repo_id"] == REPO
    assert "push_to_hub" not in json.loads(arrived["config.json"])
    assert all(r.authorization == f"Bearer {TOKEN}" for r in hub.state.requests if r.route != "lfs_upload")
    records = metrics(out)
    assert [r["commit"] for r in records if r.get("event") == "publish"] == [hub.repo(REPO).commits[0].oid]
    assert TOKEN not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("route", "status", "message"), [("commit", 500, "retry later"), ("create", 401, "HF_TOKEN")]
)
def test_a_failed_publish_is_one_error_line_and_keeps_the_checkpoints(
    tmp_path, dataset_cache, hub, capsys, route, status, message
) -> None:
    hub.fail(route, status)
    out = tmp_path / "run"

    with pytest.raises(SystemExit) as exit_info:
        cli_main(["train", *tiny_args(str(out), dataset_cache, *PUSH)])

    assert exit_info.value.code == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, errors
    assert f"HTTP {status}" in errors[0] and message in errors[0]
    assert f"ckpt push {out}/checkpoints/000002 {REPO}" in errors[0]
    assert TOKEN not in errors[0]
    assert hub.state.repos.get(REPO) is None or hub.repo(REPO).commits == []
    last = ckpt_tools.latest_step_dir(str(out))
    assert last is not None and last.endswith("000002")
    assert ckpt_tools.verify_checkpoint(last).ok
    assert {"model.safetensors", "train_config.json"} <= set(_files(Path(last) / "pretrained_model"))


def test_a_peft_run_publishes_its_adapter_to_an_fsspec_target(
    tmp_path, dataset_cache, clean_accelerate
) -> None:
    from accelerate.state import AcceleratorState

    base = train(
        parse_config(tiny_args(str(tmp_path / "base"), dataset_cache, "--policy.type=mlp", "--steps=2"))
    )
    AcceleratorState._reset_state(reset_partial_state=True)
    target = tmp_path / "release"
    args = [f"--policy.path={base.last_checkpoint}", "--peft.method_type=LORA", "--peft.r=2", "--steps=2"]
    push = ["--policy.push_to_hub=true", f"--policy.repo_id={target}"]
    summary = train(parse_config(tiny_args(str(tmp_path / "lora"), dataset_cache, *args, *push)))

    published = _files(target)
    assert {"adapter_model.safetensors", "adapter_config.json", "README.md"} <= set(published)
    assert "model.safetensors" not in published
    model_dir = Path(summary.last_checkpoint) / "pretrained_model"
    assert published["adapter_model.safetensors"] == (model_dir / "adapter_model.safetensors").read_bytes()
    assert "peft" in ModelCard(published["README.md"].decode()).data.tags


def test_a_resumed_run_publishes_when_it_finishes(tmp_path, dataset_cache, clean_accelerate) -> None:
    from accelerate.state import AcceleratorState

    target, out = tmp_path / "release", tmp_path / "run"
    push = ["--policy.type=mlp", "--policy.push_to_hub=true", f"--policy.repo_id={target}"]
    train(parse_config(tiny_args(str(out), dataset_cache, *push, "--steps=2")))
    AcceleratorState._reset_state(reset_partial_state=True)
    saved = model_file(out, 2, "train_config.json")

    resume = [f"--config_path={saved}", "--resume=true", "--steps=4", "--dataset.eval_episodes=2"]
    resumed = train(parse_config(resume))  # no push flag

    assert resumed.last_checkpoint.endswith("000004")
    model_dir = Path(resumed.last_checkpoint) / "pretrained_model"
    assert (target / "model.safetensors").read_bytes() == (model_dir / "model.safetensors").read_bytes()
    card = (target / "README.md").read_text()
    assert "| Steps | 4 |" in card and resumed.episodes == 2  # the card reports the end-of-run rollouts
    assert f"| Evaluation return (policy / random torques) | {resumed.policy_return:.1f} / " in card


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--policy.push_to_hub=true"], "--policy.push_to_hub=true needs --policy.repo_id"),
        (["--policy.push_to_hub=true", "--policy.repo_id=acme/a/b"], "--policy.repo_id=acme/a/b"),
        (["--policy.push_to_hub=true", "--policy.repo_id=just-a-name"], "needs a namespace"),
        (["--policy.push_to_hub=true", f"--policy.repo_id={REPO}"], "needs a Hub token"),
        (
            ["--policy.push_to_hub=true", "--policy.repo_id=memory://x", "--policy.private=true"],
            "Hub repos only",
        ),
    ],
)
def test_publish_settings_are_checked_before_training(
    tmp_path, dataset_cache, clean_accelerate, flags, message
):
    with pytest.raises(ConfigError, match=message) as info:
        train(parse_config(tiny_args(str(tmp_path), dataset_cache, "--policy.type=mlp", *flags)))
    assert "\n" not in str(info.value) and not isinstance(info.value, PublishFailedError)
    assert not (tmp_path / "checkpoints").exists()
