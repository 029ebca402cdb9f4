"""The way back, checked by LeRobot main itself: a step of ours, exported with `trainer export
--lerobot_step=true`, continued by LeRobot main's own `lerobot-train --resume=true --config_path=...`.

`check` (this project's venv: `python benchmarks/lerobot_side.py main-resume --lerobot-main-python=PY`,
which `nox -s lerobot_side` runs when LEROBOT_MAIN_PYTHON names LeRobot main's Python) in a scratch copy of tests/fixtures/lerobot_main_dcp's dataset:
1. trains our ACT on FSDP2 x2 (gloo), LeRobot's flags of that fixture, 2 steps, DCP checkpoints;
2. exports step 2 as LeRobot main's step;
3. resumes it with LeRobot main's `lerobot-train` on FSDP2 x2 to step 4, under LeRobot main's Python
   (`--lerobot-main-python`, LeRobot installed from its source) with the fixture's CPU launcher patch
   (`cpu_fsdp_patch/`: LeRobot's FSDP2 engine needs an accelerator otherwise; LeRobot main resumes a
   DCP step only on a sharded run). `lerobot` (this file under LeRobot's Python) is that run, its
   `resume_after_prepare` wrapped to write what it restored (full weights and AdamW state, gathered
   from its shards) before it trains on;
4. compares: the weights and the AdamW moments LeRobot restored, read back through our ACT's own
   LeRobot reader (`state_from_lerobot`), equal our step's bit for bit; every step count is ours (2);
   LeRobot logs steps 3 and 4 with finite losses and saves its step 4.
Prints each finding; exits 1 on the first that fails. Never part of the tests (no LeRobot in CI).

Measured 2026-12-06 (torch 2.13 here, LeRobot main 0.6.2.dev with torch 2.11, CPU, 2 gloo ranks each):
LeRobot restored 77 weights, 77 exp_avg and 77 exp_avg_sq (our names; LeRobot's fused q/k/v split
back) equal to ours bit for bit, every step count 2.0, and trained on: losses 12.816 (step 3) and
12.598 (step 4), its step 4 saved; about 2 minutes on 2 cores.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "lerobot_main_dcp"
ACT = [  # the fixture's own flags (its README), our ACT with the environment state as LeRobot's token
    "--dataset.repo_id=local/tiny", "--dataset.root=dataset", "--dataset.video_backend=pyav",
    "--policy.type=act", "--policy.device=cpu", "--policy.push_to_hub=false", "--policy.dim_model=32",
    "--policy.n_heads=2", "--policy.dim_feedforward=64", "--policy.n_encoder_layers=1",
    "--policy.n_decoder_layers=1", "--policy.n_vae_encoder_layers=1", "--policy.latent_dim=8",
    "--policy.chunk_size=5", "--policy.n_action_steps=5", "--policy.env_state_dim=3", "--steps=2",
    "--save_freq=2", "--batch_size=2", "--num_workers=0", "--log_freq=1", "--env_eval_freq=0",
    "--wandb.enable=false", "--seed=1", "--parallelism.dp_shard=2", "--checkpoint_format=dcp",
]  # fmt: skip
OURS_STEP = "ours/checkpoints/000002"
EXPORTED = "exported/checkpoints/000002"
RESTORED = "restored.pt"
LOSS = re.compile(r"step:(\d+) .*?loss:([-\d.naif]+)")


def check(lerobot_main_python: str) -> int:
    with tempfile.TemporaryDirectory(prefix="lerobot_main_resume_") as tmp:
        work = Path(tmp)
        shutil.copytree(FIXTURE / "dataset", work / "dataset")
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
        torchrun = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
        train = [sys.executable, *torchrun, "-m", "trainer.cli", "train", *ACT, "--output_dir=ours"]
        subprocess.run(train, cwd=work, env=env, check=True, stdout=subprocess.DEVNULL)
        export = [sys.executable, "-m", "trainer.cli", "export", f"--policy.path={OURS_STEP}"]
        subprocess.run(
            [*export, f"--output_dir={EXPORTED}", "--lerobot_step=true"], cwd=work, env=env, check=True
        )
        theirs = [
            lerobot_main_python, *torchrun, str(Path(__file__).resolve()), "lerobot", f"--dump={RESTORED}",
            "--resume=true", f"--config_path={EXPORTED}/pretrained_model/train_config.json",
            "--output_dir=resumed", "--steps=4",
        ]  # fmt: skip
        patch = {"PYTHONPATH": str(FIXTURE / "cpu_fsdp_patch"), "LR_CPU_FSDP_PATCH": "1"}
        log = subprocess.run(theirs, cwd=work, env={**env, **patch}, capture_output=True, text=True)
        if log.returncode:
            print(log.stdout[-3000:], log.stderr[-3000:])
            print(f"FAIL: LeRobot main's resume of our step exited {log.returncode}")
            return 1
        return _compare(work, log.stdout + log.stderr)


def _compare(work: Path, log: str) -> int:
    import torch

    import ckpt_tools.training
    from trainer import load_policy
    from trainer.policies.act import lerobot as act_lerobot

    restored = torch.load(work / RESTORED, weights_only=True)
    ours = load_policy(str(work / OURS_STEP), "cpu", "model").policy.state_dict()
    weights = act_lerobot.state_from_lerobot(restored["model"])
    findings = [(f"{len(weights)} weights LeRobot restored equal ours bit for bit",
                 sorted(weights) == sorted(ours) and all(torch.equal(weights[n], ours[n]) for n in ours))]  # fmt: skip
    saved = ckpt_tools.training.read_named_optimizer_state(str(work / OURS_STEP))["state"]
    state = restored["optimizer"]["state"]
    for key in ("exp_avg", "exp_avg_sq"):
        moments = act_lerobot.state_from_lerobot({fqn: entry[key] for fqn, entry in state.items()})
        same = sorted(moments) == sorted(saved) and all(torch.equal(moments[n], saved[n][key]) for n in saved)
        findings.append((f"{len(moments)} {key} LeRobot restored equal ours bit for bit", same))
    counts = {float(entry["step"]) for entry in state.values()}
    findings.append((f"LeRobot's AdamW step counts {sorted(counts)} are ours (2.0)", counts == {2.0}))
    losses = {int(step): float(loss) for step, loss in LOSS.findall(log)}
    print(f"LeRobot main's losses after the resume: {losses}")
    trained = set(losses) == {3, 4} and all(math.isfinite(v) for v in losses.values())
    saved_step = work / "resumed" / "checkpoints" / "000004" / "training_state" / "training_step.json"
    findings.append(
        ("LeRobot trains on: steps 3 and 4 logged, finite, step 4 saved", trained and saved_step.is_file())
    )
    for what, ok in findings:
        print(("ok: " if ok else "FAIL: ") + what)
    return 0 if all(ok for _, ok in findings) else 1


def lerobot(dump: str, args: list[str]) -> None:
    """LeRobot main's `lerobot-train` with `args`; right after its resume loads, every rank joins in
    gathering the full weights and AdamW state it restored, which rank 0 writes to `dump`."""
    import torch
    import torch.distributed as dist
    from lerobot.scripts import lerobot_train
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    original = lerobot_train.resume_after_prepare

    def resume_and_dump(cfg, accelerator, policy, optimizer, scheduler):  # type: ignore[no-untyped-def]
        original(cfg, accelerator, policy, optimizer, scheduler)
        model = accelerator.unwrap_model(policy)
        full = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = {
            "model": get_model_state_dict(model, options=full),
            "optimizer": get_optimizer_state_dict(
                model, getattr(optimizer, "optimizer", optimizer), options=full
            ),
        }
        if not dist.is_initialized() or dist.get_rank() == 0:
            torch.save(state, dump)

    lerobot_train.resume_after_prepare = resume_and_dump
    sys.argv = ["lerobot-train", *args]
    lerobot_train.main()


if __name__ == "__main__":  # LeRobot's half: `lerobot --dump=FILE <lerobot-train flags>`
    lerobot(sys.argv[2].removeprefix("--dump="), sys.argv[3:])
