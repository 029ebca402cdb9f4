"""GPU smoke lane (`nox -s gpu`, or plain `python benchmarks/gpu_smoke.py`): one command that checks, on
one CUDA device in a few minutes, what CPU CI cannot: the trainer in bf16 on a GPU, DCP saves (synchronous
and `background=True`) of a CUDA-resident FSDP2 model, a bit-exact resume, the conversion of the DCP
step and `trainer.load_policy` on CUDA. It prints the step time, samples/s and the save stall of each
save against a raw `dcp.save` of the same state dicts, and the device memory of a large policy built on
the meta device (act_state, 16+16 blocks of width 1024: ~470 M parameters, bf16 autocast, fp32 AdamW, one
step and a safetensors save): `max_memory_allocated` against the ideal of 16 bytes per parameter, and how
much host memory the build took (none of the model should pass through the host); the same for LeRobot's
pi0.5 at its default size (3.35 B parameters, an expert-only fine-tune in LeRobot's bfloat16, batch 2 of
the embedded camera task: benchmarks/bench_memory.py's run on one device), whose ideal counts each
tensor in its own dtype (the weights, then the trained parameters' gradients and Adam moments); and
the same for LeRobot's FastWAM at its widths and full depth (6.0 B parameters) in its frozen-video
recipe (bfloat16, the action expert trained: bench_memory's run on one device).

Without CUDA it says so in one line and exits 0 (it is no part of CPU CI). `--device cpu` runs the same
checks at toy sizes on the CPU (gloo), so the lane itself is tested where no GPU is
(tests/training/test_gpu_smoke.py); its figures mean nothing there.

Usage: python benchmarks/gpu_smoke.py [--device cuda|cpu] [--steps 200] [--hidden 1024] [--blocks 8]
       [--batch 512] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

SIZES = {"cuda": {"steps": 200, "hidden": 1024, "blocks": 8, "batch": 512}}
TOY = {"steps": 4, "hidden": 32, "blocks": 2, "batch": 8}
# The large policy of the memory check: the configuration of benchmarks/bench_memory.py on the device.
LARGE = {
    "cuda": {"dim": 1024, "heads": 16, "ffn": 4096, "layers": 16},
    "cpu": {"dim": 32, "heads": 4, "ffn": 64, "layers": 2},
}
GB = 1e9


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    for name in TOY:
        parser.add_argument(f"--{name}", type=int, default=None)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            f"gpu_smoke: no CUDA device here (torch {torch.__version__}): nothing to check; run it on a GPU machine"
        )
        return 0
    if args.device == "cuda":
        # The resume check compares two runs bit for bit, so both must run deterministic kernels: cuBLAS
        # needs this workspace setting before its first handle, and torch its deterministic mode (CPU
        # kernels are deterministic already).
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    sizes = {
        **SIZES.get(args.device, TOY),
        **{k: getattr(args, k) for k in TOY if getattr(args, k) is not None},
    }
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="gpu-smoke-"))
    started = time.perf_counter()
    step_s, samples_s = check_training(workdir, args.device, sizes)
    stalls = check_dcp(workdir, args.device, sizes)
    memory = check_large_model(workdir, args.device)
    pi05 = check_pi05(workdir, args.device)
    fastwam = check_fastwam(workdir, args.device)
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu (dry run: figures mean nothing)"
    print(f"gpu_smoke on {name}: all checks passed in {time.perf_counter() - started:.0f} s")
    print(
        f"| train step (bf16, MLP {sizes['blocks']} x {sizes['hidden']}, batch {sizes['batch']}) | {step_s * 1e3:.2f} ms | {samples_s:.0f} samples/s |"
    )
    raw = stalls["raw dcp.save"]
    for label, seconds in stalls.items():
        print(f"| save stall: {label} | {seconds * 1e3:.1f} ms | {seconds / raw:.2f} x raw dcp.save |")
    print(
        f"| large policy built on meta ({memory['parameters'] / 1e6:.0f} M parameters, bf16, fp32 AdamW) "
        f"| {memory['peak'] / GB:.2f} GB max_memory_allocated | {memory['peak'] / memory['ideal']:.2f} x ideal "
        f"(16 B/param = {memory['ideal'] / GB:.2f} GB) | host memory grew {memory['host_growth'] / GB:.2f} GB |"
    )
    rows = (("pi0.5", pi05, "expert-only"), ("FastWAM", fastwam, "freeze_video_expert, lambda_video=0"))
    for label, run, mode in rows:
        against = (
            f"{run['peak'] / run['ideal']:.2f} x ideal ({run['ideal'] / GB:.2f} GB)"
            if run["ideal"]
            else "no ideal"
        )
        print(
            f"| {label} built on meta ({run['size']}, {mode}, bfloat16) | {run['peak'] / GB:.2f} GB "
            f"max_memory_allocated | {against} | host memory grew {run['host_growth'] / GB:.2f} GB |"
        )
    return 0


def train_flags(out: Path, device: str, sizes: dict[str, int], steps: int) -> list[str]:
    return [
        "--policy.type=mlp",
        f"--policy.hidden_dim={sizes['hidden']}",
        f"--policy.blocks={sizes['blocks']}",
        "--policy.dropout=0",
        "--accelerator.mixed_precision=bf16",
        "--use_policy_training_preset=false",
        "--scheduler.type=constant",
        "--scheduler.warmup_steps=0",
        f"--batch_size={sizes['batch']}",
        f"--steps={steps}",
        f"--save_freq={sizes['steps'] // 2}",
        f"--log_freq={max(1, sizes['steps'] // 10)}",
        "--dataset.eval_episodes=0",
        f"--dataset.cache_dir={out.parent / 'cache'}",
        f"--output_dir={out}",
        f"--policy.device={device}",
    ]


def check_training(workdir: Path, device: str, sizes: dict[str, int]) -> tuple[float, float]:
    """bf16 training on the device; a run stopped halfway and resumed ends with the uninterrupted
    run's weights bit for bit. Returns the median step time and samples/s (first window dropped)."""
    from accelerate.state import AcceleratorState
    from safetensors.torch import load_file

    from trainer.cli.parse import parse_config
    from trainer.engine.plan import train

    steps = sizes["steps"]
    runs = [
        train_flags(workdir / "full", device, sizes, steps),
        train_flags(workdir / "resumed", device, sizes, steps // 2),
        [*train_flags(workdir / "resumed", device, sizes, steps), "--resume=true"],
    ]
    summaries = []
    for flags in runs:
        summaries.append(train(parse_config(flags)))
        AcceleratorState._reset_state(reset_partial_state=True)
    full, resumed = (
        load_file(f"{s.last_checkpoint}/pretrained_model/model.safetensors")
        for s in (summaries[0], summaries[2])
    )
    differ = [key for key in full if not torch.equal(full[key], resumed[key])]
    if full.keys() != resumed.keys() or differ:
        raise SystemExit(
            f"gpu_smoke: the resumed run's weights differ from the uninterrupted run's ({differ[:3]})"
        )
    records = [json.loads(line) for line in (workdir / "full" / "metrics.jsonl").read_text().splitlines()]
    rates = [r["samples_per_s"] for r in records if r.get("event") == "train" and "samples_per_s" in r]
    samples_s = statistics.median(rates[1:] or rates)
    return sizes["batch"] / samples_s, samples_s


def check_dcp(workdir: Path, device: str, sizes: dict[str, int]) -> dict[str, float]:
    """An FSDP2 policy on the device (one rank): raw dcp.save, ckpt_tools' synchronous and background
    saves, the conversion of the DCP step and load_policy on the device, which must act as the trained
    model does. Returns each save's stall in seconds."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import ckpt_tools
    import trainer
    from trainer.data.pipeline.processors import build_processors
    from trainer.distributed.wrap import register_forward_methods
    from trainer.policies import build_policy
    from trainer.policies.mlp import MLPConfig

    dist.init_process_group(
        "nccl" if device == "cuda" else "gloo", init_method=f"file://{workdir / 'pg'}", rank=0, world_size=1
    )
    try:
        ckpt_tools.training.prepare_save_groups()
        torch.manual_seed(0)
        config = MLPConfig(
            hidden_dim=sizes["hidden"], blocks=sizes["blocks"], dropout=0.0, obs_dim=3, action_dim=1
        )
        policy = build_policy(config, obs_dim=3, action_dim=1).to(device)
        mesh = init_device_mesh(device, (1,))
        for block in policy.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(policy, mesh=mesh)
        register_forward_methods(policy)  # select_action gathers the parameters as forward does
        optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
        batch = {
            "observation.state": torch.randn(sizes["batch"], 3, device=device),
            "action": torch.randn(sizes["batch"], 1, 1, device=device),
        }
        with torch.autocast(device, dtype=torch.bfloat16):
            loss, _ = policy(batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        pre, post = build_processors(
            {
                key: {"mean": torch.zeros(value.shape[-1]), "std": torch.ones(value.shape[-1])}
                for key, value in batch.items()
            }
        )
        objects: dict[str, Any] = {
            "model": policy,
            "optimizer": optimizer,
            "policy_config": config.to_dict(),
            "train_config": {},
            "processors": {
                ckpt_tools.layout.PREPROCESSOR: ckpt_tools.ProcessorState(*pre.state()),
                ckpt_tools.layout.POSTPROCESSOR: ckpt_tools.ProcessorState(*post.state()),
            },
            "manifest": False,  # like for like: a raw dcp.save hashes nothing
        }
        root = workdir / "dcp" / "checkpoints"

        def timed(action: Any) -> tuple[float, Any]:
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            result = action()
            return time.perf_counter() - start, result

        def raw() -> None:
            model_state, optim_state = get_state_dict(policy, optimizer)
            dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(workdir / "raw"))

        stalls = {}
        stalls["raw dcp.save"], _ = timed(raw)
        stalls["ckpt_tools save_checkpoint"], _ = timed(
            lambda: ckpt_tools.training.save_checkpoint(
                ckpt_tools.training.SaveRequest(checkpoints_dir=root, training_step=step_state(1), **objects)
            )
        )
        stall, pending = timed(
            lambda: ckpt_tools.training.start_checkpoint(
                ckpt_tools.training.SaveRequest(
                    checkpoints_dir=root, training_step=step_state(2), background=True, **objects
                )
            )
        )
        while not pending.written():  # training would go on here
            time.sleep(0.01)
        commit, step_dir = timed(pending.finish)
        stalls["ckpt_tools background save (start + commit)"] = stall + commit
        report = ckpt_tools.verify_checkpoint(step_dir)
        if not report.ok:
            raise SystemExit(f"gpu_smoke: the background save does not verify: {'; '.join(report.problems)}")
        ckpt_tools.convert_dcp_to_safetensors(step_dir)
        loaded = trainer.load_policy(str(step_dir), device=device)
        obs = {"observation.state": torch.randn(4, 3, device=device)}
        with torch.no_grad():
            expected = policy.select_action(obs)
            got = loaded.policy.select_action(obs)
        if not torch.equal(expected, got):
            raise SystemExit("gpu_smoke: the converted, loaded policy does not act as the trained one")
        return stalls
    finally:
        dist.destroy_process_group()


def check_large_model(workdir: Path, device: str) -> dict[str, float]:
    """A large act_state built on the meta device and materialized on the device: one step and one
    safetensors save. Returns its parameter count, the device's peak allocation (0 on the CPU), the
    ideal (16 bytes per parameter: fp32 weights, gradients and Adam's two moments) and the growth of
    the host's peak resident memory over the run (the model must not be built on the host first)."""
    from accelerate.state import AcceleratorState
    from memory_worker import vmhwm
    from safetensors import safe_open

    from trainer.cli.parse import parse_config
    from trainer.engine.plan import train

    large = LARGE[device]
    out = workdir / "large"
    flags = [
        "--policy.type=act_state",
        f"--policy.dim={large['dim']}",
        f"--policy.heads={large['heads']}",
        f"--policy.ffn_dim={large['ffn']}",
        f"--policy.encoder_layers={large['layers']}",
        f"--policy.decoder_layers={large['layers']}",
        "--policy.dropout=0",
        "--accelerator.mixed_precision=bf16",
        "--checkpoint_format=safetensors",
        "--batch_size=8",
        "--steps=1",
        "--save_freq=1",
        "--log_freq=1",
        "--dataset.episodes=4",
        "--dataset.eval_episodes=0",
        f"--dataset.cache_dir={workdir / 'cache'}",
        f"--output_dir={out}",
        f"--policy.device={device}",
    ]
    host_before = vmhwm()
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    summary = train(parse_config(flags))
    AcceleratorState._reset_state(reset_partial_state=True)
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else 0
    with safe_open(f"{summary.last_checkpoint}/pretrained_model/model.safetensors", "pt") as saved:
        count = sum(math.prod(saved.get_slice(name).get_shape()) for name in saved.keys())  # noqa: SIM118 (safe_open is not iterable)
    return {
        "parameters": count,
        "peak": peak,
        "ideal": 16 * count,
        "host_growth": max(0, vmhwm() - host_before),
    }


def check_pi05(workdir: Path, device: str) -> dict[str, Any]:
    """LeRobot's pi0.5 built on the meta device and materialized on the device, an expert-only
    fine-tune in bfloat16: one step and one safetensors save, at LeRobot's default size on CUDA (the
    fixture's tiny sizes on the CPU, where there is nothing to measure). Returns `run_subject`'s
    figures."""
    from bench_memory import pi

    subject = pi(workdir, "pi05", "expert-bf16", depth=None, vision_depth=None)
    return run_subject(workdir / "pi05", device, subject, "LeRobot's default size")


def check_fastwam(workdir: Path, device: str) -> dict[str, Any]:
    """LeRobot's FastWAM built on the meta device and materialized on the device, LeRobot's frozen-video
    recipe (`freeze_video_expert`, `lambda_video=0`, bfloat16): one step and one safetensors save, at
    LeRobot's widths and full depth (30 MoT layers, 6.0 B parameters) on CUDA, the fixture's tiny sizes
    on the CPU. The frozen parts are bench_memory's (a one-layer UMT5 of LeRobot's width, released
    before step 1; the fixture's tiny VAE). Returns `run_subject`'s figures."""
    from bench_memory import fastwam

    subject = fastwam(workdir, "freeze-bf16", depth=30)
    return run_subject(workdir / "fastwam", device, subject, "LeRobot's widths, 30 MoT layers")


def run_subject(out: Path, device: str, subject: Any, size: str) -> dict[str, Any]:
    """One step and one save of a bench_memory subject on one device, at its large sizes on CUDA and
    its tiny ones on the CPU. Returns the size it ran, the device's peak allocation, the ideal at the
    large size (bench_memory's: the weights' bytes plus each trained parameter's gradient and Adam
    moments, in their dtypes; 0 on the CPU) and the growth of the host's peak resident memory."""
    from accelerate.state import AcceleratorState
    from bench_memory import train_flags
    from memory_worker import vmhwm

    from trainer.cli.parse import parse_config
    from trainer.engine.plan import train

    on_cuda = device == "cuda"
    sizes = subject.large if on_cuda else subject.tiny
    flags = train_flags(out, out.parent / "cache", "1", [*subject.run, *sizes])
    host_before = vmhwm()
    if on_cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    train(parse_config([*flags, f"--policy.device={device}"]))
    AcceleratorState._reset_state(reset_partial_state=True)
    parameters = f"{size}, {(subject.trainable + subject.frozen) / 1e6:.0f} M parameters"
    return {
        "size": parameters if on_cuda else "the fixture's tiny sizes",
        "peak": torch.cuda.max_memory_allocated() if on_cuda else 0,
        "ideal": subject.weight_bytes + subject.trained_bytes if on_cuda else 0,
        "host_growth": max(0, vmhwm() - host_before),
    }


def step_state(step: int) -> Any:
    from ckpt_tools import TrainingStep
    from ckpt_tools.training import SamplerPosition, Topology

    return TrainingStep(
        step=step,
        dp_world_size=1,
        batch_size=1,
        grad_accum_steps=1,
        mixed_precision="bf16",
        topology=Topology(),
        checkpoint_format="dcp",
        sampler=SamplerPosition(epoch=0, offset=0),
        seed=0,
        peft=False,
    )


if __name__ == "__main__":
    sys.exit(main())
