"""A training run whose output_dir is a bucket on a real S3-compatible server (moto, through s3fs).

2 ranks of FSDP2 write DCP and safetensors checkpoints to `s3://<bucket>/prefix/run`; rank 1 is killed
before step 4 and `--resume=true --output_dir=s3://...` continues on one process from `last` (a text
object). The ckpt commands then read, convert and publish the remote step, and `load_model_state_dict` and
`trainer.load_policy` load it.
`trainer eval --watch s3://...` then scores the run's steps in the bucket, killed and started again.
The credentials reach every process through the environment only: no written object and no console
line may contain the secret.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import fsspec
import pytest
import torch

import ckpt_tools
import trainer
from ckpt_tools import layout
from helpers.launch import CKPT_CLI, run_torchrun
from helpers.waiting import wait_for

pytestmark = [pytest.mark.distributed, pytest.mark.slow, pytest.mark.timeout(300)]

SCRIPT = Path(__file__).parent / "scripts" / "resume_train.py"


def ckpt(*args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(CKPT_CLI), *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"ckpt {' '.join(args)}: {result.stdout}{result.stderr}"
    return result


def test_fsdp2_run_on_s3_saves_resumes_converts_and_publishes(s3_server, s3_bucket, tmp_path):
    store = fsspec.filesystem("s3", use_listings_cache=False)
    out = f"{s3_bucket}/prefix/run"
    checkpoints = f"{out}/checkpoints"
    flags = [
        f"--output_dir={out}",
        f"--dataset.cache_dir={tmp_path / 'cache'}",
        "--policy.type=mlp",
        "--policy.hidden_dim=16",
        "--dataset.episodes=1",
        "--dataset.eval_episodes=0",
        "--steps=4",
        "--save_freq=2",
        "--log_freq=1",
    ]
    fsdp2 = ["--parallelism.dp_shard=2", "--batch_size=8", "--checkpoint_format=safetensors_dcp"]
    crashed = run_torchrun(SCRIPT, 2, "--hook-kill-train=1:4", *flags, *fsdp2, check=False)
    assert crashed.returncode != 0 and "hook: rank 1 killed at its training step call 4" in crashed.stdout
    assert store.cat(f"{checkpoints}/last") == b"000002\n"  # a text object: S3 has no links
    step2 = f"{checkpoints}/000002"
    assert store.isfile(f"{step2}/pretrained_model/{layout.MODEL_SAFETENSORS}")
    assert store.isfile(f"{step2}/pretrained_model/{layout.MODEL_DCP_DIR}/{layout.DCP_METADATA}")
    assert store.isfile(f"{step2}/training_state/{layout.OPTIMIZER_DCP_DIR}/{layout.DCP_METADATA}")

    resumed = run_torchrun(SCRIPT, 1, "--resume=true", f"--output_dir={out}", "--batch_size=16")
    assert f"resuming from {step2} at step 2" in resumed.stdout, resumed.stdout
    assert store.cat(f"{checkpoints}/last") == b"000004\n"
    assert ckpt_tools.read_training_step(out).step == 4
    records = [json.loads(line) for line in store.cat(f"{out}/metrics.jsonl").decode().splitlines()]
    assert [r["step"] for r in records if r.get("event") == "resume"] == [2]
    assert {r["step"] for r in records if r.get("event") == "train"} == {1, 2, 3, 4}
    assert store.isfile(f"{out}/loss_curve.png")

    ckpt("verify", out)
    described = json.loads(ckpt("inspect", step2, "--json").stdout)
    assert described["step"] == 2
    converted = f"{s3_bucket}/converted"
    ckpt("convert", step2, "--output", converted)  # DCP shards -> safetensors, bucket to bucket
    ckpt("verify", converted)
    assert "IDENTICAL" in ckpt("diff", step2, converted).stdout  # the step's safetensors == its DCP
    published = f"{s3_bucket}/published/model"
    ckpt("push", f"{checkpoints}/last", published)
    got = ckpt_tools.load_model_state_dict(published)
    want = ckpt_tools.load_model_state_dict(f"{checkpoints}/000004")
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert not store.exists(f"{published}/{layout.TRAINING_STATE_DIR}")
    policy = trainer.load_policy(f"{checkpoints}/last").policy.state_dict()
    assert all(torch.equal(policy[k], want[k]) for k in want)

    _watch_scores_the_bucket_and_resumes_after_being_killed(store, out)

    secret = s3_server.secret
    for key in store.find(s3_bucket):
        assert secret.encode() not in store.cat(key), key
    for text in (crashed.stdout, resumed.stdout):
        assert secret not in text
    train_config = store.cat(f"{step2}/pretrained_model/{layout.TRAIN_CONFIG}").decode()
    assert "AWS_" not in train_config and s3_server.endpoint not in train_config


def _watch_scores_the_bucket_and_resumes_after_being_killed(store, out: str) -> None:
    """`trainer eval --watch s3://...` scores the run's committed steps in the pendulum (the run asked
    for no environment: every step is due), each eval.json written into the bucket; killed after the
    first, it is started again and scores only the rest. No run holds the bucket, so the watchers log
    the scores into its metrics.jsonl themselves, each once."""
    watch = [sys.executable, "-m", "trainer.cli", "eval", f"--watch={out}", "--env.type=pendulum"]
    watch += ["--eval.n_episodes=1", "--eval.batch_size=1", "--eval.use_async_envs=false"]
    watch += ["--eval.max_episodes_rendered=0"]
    step2 = f"{out}/checkpoints/000002"
    first = subprocess.Popen(watch, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: store.exists(f"{step2}/eval.json"), "score of step 2", process=first)
    finally:
        first.kill()
        first.wait(timeout=30)
    scores = {name: f"{out}/checkpoints/{name}/eval.json" for name in ("000002", "000004")}
    before = {name: store.cat(path) for name, path in scores.items() if store.exists(path)}
    assert "000002" in before

    second = subprocess.run([*watch, "--json"], capture_output=True, text=True, timeout=180)
    assert second.returncode == 0, second.stdout + second.stderr
    assert json.loads(second.stdout.strip().splitlines()[-1])["scored"] == 2 - len(before)
    assert "the run's last step 4 is scored: the evaluator stops" in second.stderr
    after = {name: json.loads(store.cat(path)) for name, path in scores.items()}
    assert all(store.cat(scores[name]) == data for name, data in before.items())  # nothing scored twice
    assert [(s["step"], s["env"], s["overall"]["n_episodes"]) for s in after.values()] == [
        (2, "pendulum", 1),
        (4, "pendulum", 1),
    ]
    records = [json.loads(line) for line in store.cat(f"{out}/metrics.jsonl").decode().splitlines()]
    logged = [(r["step"], r["avg_sum_reward"]) for r in records if r.get("event") == "eval"]
    assert logged == [
        (2, after["000002"]["overall"]["avg_sum_reward"]),
        (4, after["000004"]["overall"]["avg_sum_reward"]),
    ]
    assert not store.exists(f"{out}/trainer.lock")  # each watcher let go of the run's lock
