"""One torchrun worker of the engine benchmark (bench_engine.py launches it; never part of the tests).

Modes (first argument), each printing one `RESULT {json}` line on rank 0:
  bare OUT H K B STEPS W   a bare FSDP2 loop over the trainer's MLP policy (same classes, wrap units,
                           AdamW settings, gradient clipping and batch shape as `trainer train`), timed
                           as the trainer's metrics time it: STEPS + W steps in windows of W, the first
                           window dropped as warm-up, the median window's seconds per step; each step
                           draws its batch from in-memory tensors of the pendulum dataset's size (the
                           trainer's data path costs well under 1 % of a step: it is in both, not
                           left out of one).
  saves OUT H K ROUNDS     after a few steps, the stall of a synchronous `ckpt_tools.training.save_checkpoint`
                           (DCP), the same without its manifest (no hashing), and a raw `dcp.save` of
                           the same model and optimizer state dicts (taken at the call, as torch's DCP
                           recipe does): ROUNDS rounds, the order rotated each round, a warm-up round
                           first; each save's files are deleted once it is timed, so the dirty pages
                           of earlier saves do not throttle the later ones.
  write OUT H K            save one step in `safetensors` and one in `dcp` format (for the resume modes),
                           and a DDP run's step (gathered weights, optimizer_state.safetensors).
  fresh|safetensors|safetensors-full|dcp|ddp OUT H K
                           build the sharded model and optimizer, then load nothing / the safetensors
                           step / the same step the pre-slicing way (every rank reads the whole file) /
                           the DCP step / the DDP step; report each rank's peak RSS.
"""

from __future__ import annotations

import json
import resource
import shutil
import sys
import time
from statistics import median
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import ckpt_tools
from ckpt_tools import TrainingStep
from ckpt_tools.training import SamplerPosition, Topology
from trainer.data.dataset import ACTION_KEY, OBS_KEY
from trainer.policies.mlp import MLPBlock, MLPConfig, MLPPolicy

OBS_DIM, ACTION_DIM = 3, 1  # the pendulum dataset's
DATASET_FRAMES = 10_000  # its default 50 episodes of 200 steps


def build(hidden: int, blocks: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The trainer's MLP policy, wrapped as the trainer wraps it (each MLPBlock, then the root)."""
    torch.manual_seed(0)
    policy = MLPPolicy(MLPConfig(obs_dim=OBS_DIM, action_dim=ACTION_DIM, hidden_dim=hidden, blocks=blocks))
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for module in policy.modules():
        if isinstance(module, MLPBlock):
            fully_shard(module, mesh=mesh)
    fully_shard(policy, mesh=mesh)
    optimizer = torch.optim.AdamW(
        policy.parameters(), lr=0.002, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-4
    )
    return policy, optimizer


def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: dict[str, torch.Tensor]) -> None:
    loss, _ = model(batch)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
    optimizer.step()
    optimizer.zero_grad()


def training_step(fmt: str, number: int = 1, sharded: bool = True) -> TrainingStep:
    world = dist.get_world_size()
    return TrainingStep(
        step=number,
        dp_world_size=world,
        batch_size=1,
        grad_accum_steps=1,
        mixed_precision="no",
        topology=Topology(dp_shard=world) if sharded else Topology(dp_replicate=world),
        checkpoint_format=fmt,
        sampler=SamplerPosition(epoch=0, offset=0),
    )


def save(
    out: str,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    fmt: str,
    number: int,
    manifest: bool = True,
    sharded: bool = True,
) -> None:
    ckpt_tools.training.save_checkpoint(
        ckpt_tools.training.SaveRequest(
            checkpoints_dir=out,
            training_step=training_step(fmt, number, sharded),
            model=model,
            optimizer=optimizer,
            policy_config={},
            train_config={},
            manifest=manifest,
        )
    )


def timed(action: Any) -> float:
    dist.barrier()
    start = time.perf_counter()
    action()
    dist.barrier()
    return time.perf_counter() - start


def bare(out: str, hidden: int, blocks: int, batch_size: int, steps: int, window: int) -> dict[str, Any]:
    model, optimizer = build(hidden, blocks)
    generator = torch.Generator().manual_seed(dist.get_rank())
    observations = torch.randn(DATASET_FRAMES, OBS_DIM, generator=generator)
    actions = torch.randn(DATASET_FRAMES, ACTION_DIM, generator=generator)

    def next_batch() -> dict[str, torch.Tensor]:
        rows = torch.randint(DATASET_FRAMES, (batch_size,), generator=generator)
        return {OBS_KEY: observations[rows], ACTION_KEY: actions[rows][:, None]}

    windows = []
    for _ in range(steps // window + 1):  # the first window is the warm-up, as in the trainer's metrics
        windows.append(timed(lambda: [step(model, optimizer, next_batch()) for _ in range(window)]) / window)
    return {"step_s": median(windows[1:])}


def saves(out: str, hidden: int, blocks: int, rounds: int) -> dict[str, Any]:
    model, optimizer = build(hidden, blocks)
    batch = {OBS_KEY: torch.randn(128, OBS_DIM), ACTION_KEY: torch.randn(128, 1, ACTION_DIM)}
    for _ in range(3):
        step(model, optimizer, batch)

    def raw(number: int) -> None:
        state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)}
        dcp.save(state, checkpoint_id=f"{out}/raw/{number}")

    actions = {
        "ckpt_save_s": lambda r: save(f"{out}/ckpt", model, optimizer, "dcp", r),
        "ckpt_save_no_manifest_s": lambda r: save(f"{out}/plain", model, optimizer, "dcp", r, manifest=False),
        "raw_save_s": raw,
    }
    names = list(actions)
    stalls: dict[str, list[float]] = {name: [] for name in names}
    for number in range(rounds + 1):  # round 0 warms every side up (imports, the save's gloo groups)
        for name in names[number % 3 :] + names[: number % 3]:
            stalls[name].append(timed(lambda a=actions[name], n=number: a(n + 1)))
            if dist.get_rank() == 0:
                shutil.rmtree(out, ignore_errors=True)
            dist.barrier()
    stall = {name: median(times[1:]) for name, times in stalls.items()}
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return {**stall, "state_bytes": 3 * weights}  # the weights and AdamW's two moments


def write(out: str, hidden: int, blocks: int) -> dict[str, Any]:
    model, optimizer = build(hidden, blocks)
    batch = {OBS_KEY: torch.randn(4, OBS_DIM), ACTION_KEY: torch.randn(4, 1, ACTION_DIM)}
    step(model, optimizer, batch)  # optimizer state exists
    save(f"{out}/safetensors", model, optimizer, "safetensors", 1)
    save(f"{out}/dcp", model, optimizer, "dcp", 1)
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    del model, optimizer
    torch.manual_seed(0)  # a DDP run's checkpoint: every rank holds the whole model, as a DDP rank does
    plain = MLPPolicy(MLPConfig(obs_dim=OBS_DIM, action_dim=ACTION_DIM, hidden_dim=hidden, blocks=blocks))
    plain_optimizer = torch.optim.AdamW(plain.parameters(), lr=0.002, weight_decay=1e-4)
    step(plain, plain_optimizer, batch)
    save(f"{out}/ddp", plain, plain_optimizer, "safetensors", 1, sharded=False)
    return {"bytes": size}


def resume(mode: str, out: str, hidden: int, blocks: int) -> dict[str, Any]:
    model, optimizer = build(hidden, blocks)
    batch = {OBS_KEY: torch.randn(4, OBS_DIM), ACTION_KEY: torch.randn(4, 1, ACTION_DIM)}
    step(model, optimizer, batch)  # a fresh start also has its optimizer state after one step
    if mode == "safetensors":
        ckpt_tools.training.load_training_state(f"{out}/safetensors/000001", model=model, optimizer=optimizer)
    elif mode == "dcp":
        ckpt_tools.training.load_training_state(f"{out}/dcp/000001", model=model, optimizer=optimizer)
    elif mode == "ddp":
        ckpt_tools.training.load_training_state(f"{out}/ddp/000001", model=model, optimizer=optimizer)
    elif mode == "safetensors-full":  # how a resume read gathered weights before: the whole file per rank
        full = ckpt_tools.load_model_state_dict(f"{out}/safetensors/000001")
        set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True))
    peak = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0])  # MiB
    peaks = [torch.zeros(1) for _ in range(dist.get_world_size())]
    dist.all_gather(peaks, peak)
    return {"peak_rss_mib": [float(p) for p in peaks]}


def main(argv: list[str]) -> None:
    dist.init_process_group("gloo")
    mode, out, *numbers = argv
    sizes = [int(n) for n in numbers]
    if mode == "bare":
        result = bare(out, *sizes)
    elif mode == "saves":
        result = saves(out, *sizes)
    elif mode == "write":
        result = write(out, *sizes)
    else:
        result = resume(mode, out, *sizes)
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
