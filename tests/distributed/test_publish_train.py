"""The end-of-training publish is collective: 2 FSDP2 ranks through the real CLI, DCP-only checkpoints,
the loopback Hub server in this pytest process. Every rank enters; the main rank converts the DCP shards
and uploads once; a failed upload ends every rank with one error line and exit code 1, never a hang.
The same run pushes each checkpoint while it trains (--save_checkpoint_to_hub), through a Hub failure."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from huggingface_hub import ModelCard

import ckpt_tools
from helpers.hub_server import HubServer
from helpers.launch import run_torchrun

pytestmark = pytest.mark.distributed

SCRIPT = Path(__file__).parent / "scripts" / "train_cli.py"
TOKEN = "hf_distributedLOOPBACKtoken24680"
REPO = "acme/pendulum-fsdp2"


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[HubServer]:
    """Reached by the torchrun workers through HF_ENDPOINT / HF_TOKEN in their environment."""
    with HubServer() as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        yield server


def _launch(out: Path, repo_id: str, check: bool, *extra: str):
    args = [
        f"--output_dir={out}",
        f"--dataset.cache_dir={out.parent / 'dataset_cache'}",
        "--dataset.episodes=4",
        "--dataset.eval_episodes=0",
        "--policy.type=mlp",
        "--steps=2",
        "--log_freq=1",
        "--save_freq=2",
        "--batch_size=8",
        "--parallelism.dp_shard=2",
        "--checkpoint_format=dcp",
        "--policy.push_to_hub=true",
        f"--policy.repo_id={repo_id}",
        *extra,
    ]
    return run_torchrun(SCRIPT, 2, *args, timeout=180, check=check)


def test_fsdp2_dcp_run_pushes_each_checkpoint_and_publishes_once_from_the_main_rank(tmp_path, hub) -> None:
    hub.fail_next("commit", 1)  # step 2's first push attempt: retried
    pushes = ("--save_checkpoint_to_hub=true", "--steps=4", "--keep_last=1", "--save_shard_size=16KiB")
    log = _launch(tmp_path / "run", REPO, True, *pushes).stdout

    last = Path(ckpt_tools.latest_step_dir(str(tmp_path / "run")))
    model_dir = last / "pretrained_model"
    assert (model_dir / "pytorch_model_fsdp_0" / ".metadata").is_file()  # the DCP shards stay
    assert ckpt_tools.verify_checkpoint(last).ok  # the converted shards agree with the DCP shards
    arrived = hub.files(REPO)
    summaries = [commit.summary for commit in hub.repo(REPO).commits]
    assert [s[:25] for s in summaries[:2]] == ["Checkpoint at step 000002", "Checkpoint at step 000004"]
    assert len(summaries) == 3 and hub.routes().count("commit") == 4  # 2 pushes (one retried), 1 publish
    assert set(hub.repo(REPO).tags) == {"step-000002", "step-000004"}
    # --save_shard_size: the conversions for the pushes and the publish write Hugging Face's shards
    weights = {p.name: p.read_bytes() for p in model_dir.glob("model*")}
    assert "model.safetensors.index.json" in weights and len(weights) > 2, sorted(weights)
    tagged = hub.tagged(REPO, "step-000004")
    assert all(tagged[name] == data and arrived[name] == data for name, data in weights.items())
    assert log.count("published ") == 1 and log.count("pushed step ") == 2 and "warning" not in log
    assert {"config.json", "train_config.json", "README.md"} <= set(arrived)
    assert not any(name.endswith(".distcp") or name.startswith("pytorch_model_fsdp") for name in arrived)
    card = ModelCard(arrived["README.md"].decode())
    assert "FSDP2 2 (2 ranks)" in card.text and "| Final loss |" in card.text
    assert TOKEN not in log


def test_a_failed_upload_fails_every_rank_with_one_line(tmp_path, hub) -> None:
    hub.fail("commit", 500)
    result = _launch(tmp_path / "run", "acme/pendulum-fails", check=False)

    assert result.returncode == 1, result.stdout
    errors = [line for line in result.stdout.splitlines() if line.startswith("error:")]
    # One line per rank, the same on each; torchrun may stop a rank before it prints, once another
    # rank has exited with the error.
    assert 1 <= len(errors) <= 2 and len(set(errors)) == 1, result.stdout
    assert "HTTP 500" in errors[0] and "ckpt push" in errors[0]
    # no worker traceback: the only one is torchrun's own report that a worker exited 1
    assert result.stdout.count("Traceback") == result.stdout.count("ChildFailedError:") == 1
    assert hub.repo("acme/pendulum-fails").commits == []
    assert ckpt_tools.latest_step_dir(str(tmp_path / "run")).endswith("000002")
