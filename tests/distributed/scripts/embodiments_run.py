"""A tiny SmolVLA on a mixture of two robots that differ, FSDP2 on 2 gloo ranks, all in one torchrun launch.

usage: embodiments_run.py OUT WORKDIR

WORKDIR holds the tiny backbone (`tiny_smolvlm/`), LeRobot's `dataset_video/` (state 4, action 2, two
video cameras, 10 fps), LeRobot's `dataset_arm6/` (state 6, action 3, one image camera, 15 fps) and
`mixture.json` naming both. `straight` trains 4 steps (saves and held-out losses per member at 2 and 4);
rank 0 then copies it to `resumed` as it was after step 2 (`cut_at_step_2`), which resumes to step 4. Then, on
the resumed run's sharded model, one forward and backward on each robot's samples alone (the same on both
ranks): rank 0 writes the full gradient of the action output projection for each to OUT/grads.pt.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import sys
from typing import Any

import clean_exit
import torch
import torch.distributed as dist
from fresh_accelerator import reset_accelerate

import trainer.engine.loop
from trainer.cli.parse import parse_config
from trainer.engine.plan import train

OUT, WORKDIR = sys.argv[1:]
RUN = [
    "--policy.type=smolvla", "--policy.vlm_model_name=tiny_smolvlm", "--policy.chunk_size=5",
    "--policy.n_action_steps=5", "--policy.num_vlm_layers=4", "--policy.num_steps=3",
    "--policy.resize_imgs_with_padding=[32,32]", "--dataset.mixture=mixture.json", "--batch_size=2",
    "--num_workers=0", "--log_freq=1", "--seed=3", "--save_freq=2", "--parallelism.dp_shard=2",
    "--dataset.eval_split=0.5", "--eval_freq=2", "--max_eval_samples=4",
]  # fmt: skip
STRAIGHT = [*RUN, "--steps=4", f"--output_dir={OUT}/straight"]
RESUMED = ["--resume=true", "--steps=4", f"--output_dir={OUT}/resumed"]


def capture_runs() -> dict[str, Any]:
    """The `Run` each train() builds, kept: the loop's `start_run` wrapped."""
    captured: dict[str, Any] = {}
    start_run = trainer.engine.loop.start_run

    def keep(*args: Any, **kwargs: Any) -> Any:
        started = start_run(*args, **kwargs)
        captured["run"] = started.run
        return started

    trainer.engine.loop.start_run = keep
    return captured


def cut_at_step_2() -> None:
    """`straight` as it was after step 2: the copy's step 4 removed, `last` moved back and the records
    from step 3 on dropped from its metrics.jsonl (the resumed run writes its own)."""
    if dist.get_rank() == 0:
        shutil.copytree(f"{OUT}/straight", f"{OUT}/resumed", symlinks=True)
        shutil.rmtree(f"{OUT}/resumed/checkpoints/000004")
        os.remove(f"{OUT}/resumed/checkpoints/last")
        os.symlink("000002", f"{OUT}/resumed/checkpoints/last")
        with open(f"{OUT}/resumed/metrics.jsonl", encoding="utf-8") as handle:
            kept = list(itertools.takewhile(lambda line: json.loads(line).get("step", 0) <= 2, handle))
        with open(f"{OUT}/resumed/metrics.jsonl", "w", encoding="utf-8") as handle:
            handle.writelines(kept)
    dist.barrier()


def action_gradients(run: Any) -> dict[str, torch.Tensor]:
    """Collective. The full gradient of `action_out_proj` (weight and bias) for a batch of each robot's
    samples alone, through the sharded model and the run's own preprocessor."""
    model, data = run.model, run.feed.dataset
    projection = run.accelerator.unwrap_model(model).model.action_out_proj
    start = int(data.weighted_order.starts[1])  # the second member's first frame
    out = {}
    model.train()
    for name, indices in (("video", [0, 7]), ("arm6", [start, start + 3])):
        model.zero_grad(set_to_none=True)
        batch = run.preprocessor(data.gather(torch.tensor(indices), run.feed.frames))
        loss, _ = model(batch)
        run.accelerator.backward(loss)
        for part in ("weight", "bias"):
            grad = getattr(projection, part).grad
            out[f"{name}.{part}"] = grad.full_tensor() if hasattr(grad, "full_tensor") else grad
    return out


if __name__ == "__main__":
    os.chdir(WORKDIR)
    runs = capture_runs()
    reset_accelerate()
    print("=== run straight", flush=True)
    train(parse_config(STRAIGHT))
    cut_at_step_2()
    reset_accelerate()
    print("=== run resumed", flush=True)
    train(parse_config(RESUMED))
    grads = action_gradients(runs["run"])
    if dist.get_rank() == 0:
        torch.save(grads, f"{OUT}/grads.pt")
    reset_accelerate()
    clean_exit.leave()
