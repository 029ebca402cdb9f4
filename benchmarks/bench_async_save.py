"""Save stall benchmark: how long training waits for a checkpoint, synchronous vs `--async_save`.

Two gloo ranks shard a model with FSDP2 (weights `--size-mb` in fp32, AdamW state twice that) and save
it in the DCP format through `ckpt_tools`: `save_checkpoint` (the whole save stalls training) against
`start_checkpoint(SaveRequest(background=True))` (training waits only for staging, the gathered/side files and, at
the next boundary, the commit). Between the async start and the commit the ranks keep computing, as
training would. Prints the mean per-save stall of each and their ratio. Run through `nox -s bench`.

Usage: python benchmarks/bench_async_save.py [--size-mb 400] [--repeat 3] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mb", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.size_mb, args.repeat, args.workdir)
        return
    with tempfile.TemporaryDirectory(dir=args.workdir) as workdir:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
        command += [__file__, "--worker", f"--size-mb={args.size_mb}", f"--repeat={args.repeat}"]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        subprocess.run([*command, f"--workdir={workdir}"], check=True, env=env)


def worker(size_mb: int, repeat: int, workdir: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import ckpt_tools
    from ckpt_tools import TrainingStep
    from ckpt_tools.training import SamplerPosition, Topology

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    width = 2048
    layers = max(1, size_mb * 2**20 // (4 * width * width))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])
    mesh = init_device_mesh("cpu", (2,))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = torch.randn(8, width)

    def train_step() -> None:
        model(batch).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()

    train_step()  # the optimizer state exists from here on

    def step_state(step: int) -> TrainingStep:
        return TrainingStep(
            step=step,
            dp_world_size=2,
            batch_size=8,
            grad_accum_steps=1,
            mixed_precision="no",
            topology=Topology(dp_shard=2),
            checkpoint_format="dcp",
            sampler=SamplerPosition(epoch=0, offset=0),
            seed=0,
            peft=False,
        )

    objects = {"model": model, "optimizer": optimizer, "policy_config": {}, "train_config": {}}
    root = os.path.join(workdir, "checkpoints")
    sync, stalls, background = [], [], []
    for i in range(repeat):
        dist.barrier()
        start = time.perf_counter()
        ckpt_tools.training.save_checkpoint(
            ckpt_tools.training.SaveRequest(
                checkpoints_dir=root, training_step=step_state(2 * i + 1), **objects
            )
        )
        sync.append(time.perf_counter() - start)
        train_step()

        dist.barrier()
        start = time.perf_counter()
        pending = ckpt_tools.training.start_checkpoint(
            ckpt_tools.training.SaveRequest(
                checkpoints_dir=root, training_step=step_state(2 * i + 2), background=True, **objects
            )
        )
        stall = time.perf_counter() - start
        began = time.perf_counter()
        steps = 0
        while True:  # training goes on; the ranks agree at each step whether every write is done
            train_step()
            steps += 1
            done = torch.tensor([int(pending.written())])
            dist.all_reduce(done, op=dist.ReduceOp.MIN)
            if done.item():
                break
        background.append(time.perf_counter() - began)
        start = time.perf_counter()
        pending.finish()
        stalls.append(stall + time.perf_counter() - start)
    if rank == 0:
        gb = (3 * size_mb) / 1024
        mean = sum(sync) / len(sync)
        stall = sum(stalls) / len(stalls)
        print(
            f"save stall, FSDP2 on 2 gloo ranks, {gb:.2f} GB per checkpoint (weights + AdamW), {repeat} saves each"
        )
        print("| save | stall per save (s) | ratio to sync |")
        print("|---|---|---|")
        print(f"| synchronous save_checkpoint | {mean:.2f} | 1.00 |")
        print(f"| --async_save (staging + commit) | {stall:.2f} | {stall / mean:.2f} |")
        print(f"background write while training went on: {sum(background) / len(background):.2f} s per save")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
