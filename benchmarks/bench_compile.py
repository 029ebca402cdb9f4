"""Activation checkpointing and torch.compile: what each buys, as ratios measured in the same process.

One process, the MLP policy with the trainer's own transforms (`trainer.distributed.units`), AdamW:

1. Activation memory: bytes autograd keeps for backward over one forward (counted exactly with
   `saved_tensors_hooks`, on any device), with and without `--accelerator.activation_checkpointing`;
   on CUDA also the peak allocated memory of a training step. Goal: well under 1 (the unit inputs only).
2. Step time: median training step with and without checkpointing (its recompute cost), and with and
   without `--accelerator.compile` (inductor when it can build here, else aot_eager, which says so),
   after a warm-up that absorbs the compilation. compile's gain on CPU (a C++ kernel per fused loop)
   is not its gain on a GPU (Triton kernels, fewer launches): measure it there with `--device cuda`.

Usage: python benchmarks/bench_compile.py [--hidden 512] [--blocks 8] [--batch 256] [--steps 20] [--repeat 5]
       [--device cpu|cuda] [--backend inductor]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from statistics import median

import torch

from trainer.config.accelerator import AcceleratorConfig
from trainer.distributed.units import apply_unit_transforms
from trainer.distributed.wrap import WrapPlan
from trainer.policies import build_policy
from trainer.policies.mlp import MLPConfig

PLAN = WrapPlan(("MLPBlock",))


def build(args: argparse.Namespace, **flags: object) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    policy = build_policy(MLPConfig(hidden_dim=args.hidden, blocks=args.blocks), obs_dim=32, action_dim=8)
    policy.to(args.device)
    apply_unit_transforms(policy, PLAN, AcceleratorConfig(**flags), sharded=False)  # type: ignore[arg-type]
    return policy, torch.optim.AdamW(policy.parameters(), lr=1e-4)


def batch(args: argparse.Namespace) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    obs, action = (
        torch.randn(args.batch, 32, generator=generator),
        torch.randn(args.batch, 1, 8, generator=generator),
    )
    return {"observation.state": obs.to(args.device), "action": action.to(args.device)}


def saved_bytes(args: argparse.Namespace, **flags: object) -> int:
    policy, _ = build(args, **flags)
    total = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss, _ = policy(batch(args))
    loss.backward()
    return total


def stepper(args: argparse.Namespace, **flags: object) -> Callable[[], None]:
    """One training step of a policy built with `flags`, warmed up (compiled, optimizer state allocated)."""
    policy, optimizer = build(args, **flags)
    data = batch(args)

    def step() -> None:
        loss, _ = policy(data)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    for _ in range(3):
        step()
    return step


def window_seconds(args: argparse.Namespace, step: Callable[[], None]) -> tuple[float, int | None]:
    """Median step time over one window, and on CUDA the peak allocated bytes of its steps."""
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return median(times), torch.cuda.max_memory_allocated() if cuda else None


def usable_backend(args: argparse.Namespace) -> str:
    """inductor when it compiles here (a C++ compiler on CPU), else aot_eager, said on one line."""
    if args.backend != "inductor":
        return args.backend
    try:
        torch.compile(lambda x: x * 2 + 1, backend="inductor")(torch.ones(4, device=args.device))
        return "inductor"
    except Exception as exc:  # a missing compiler surfaces as several torch exception types
        print(f"inductor cannot compile here ({type(exc).__name__}): compile measured with aot_eager")
        return "aot_eager"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=20, help="per timed window")
    parser.add_argument("--repeat", type=int, default=5, help="windows per setting, alternated")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--backend", default="inductor")
    args = parser.parse_args()
    backend = usable_backend(args)
    compiled = {"compile": True, "compile_backend": backend}

    plain_saved = saved_bytes(args)
    ac_saved = saved_bytes(args, activation_checkpointing=True)
    steps = {
        "plain": stepper(args),
        "ac": stepper(args, activation_checkpointing=True),
        "compiled": stepper(args, **compiled),
        "both": stepper(args, activation_checkpointing=True, **compiled),
    }
    windows: dict[str, list[tuple[float, int | None]]] = {name: [] for name in steps}
    for _ in range(args.repeat):  # alternated, so a load change on a shared machine hits every side
        for name, step in steps.items():
            windows[name].append(window_seconds(args, step))
    plain_time, ac_time, compiled_time, both_time = (median(t for t, _ in windows[n]) for n in steps)
    plain_peak, ac_peak = windows["plain"][-1][1], windows["ac"][-1][1]

    print(
        f"MLP {args.blocks} blocks x {args.hidden}, batch {args.batch}, device {args.device}, compile {backend}"
    )
    print("| measure | with | without | ratio | goal |")
    print("|---|---|---|---|---|")
    print(
        f"| saved for backward (activation checkpointing) | {ac_saved / 2**20:.2f} MiB | {plain_saved / 2**20:.2f} MiB | {ac_saved / plain_saved:.3f} | < 0.5 |"
    )
    if plain_peak is not None and ac_peak is not None:
        print(
            f"| CUDA peak of a step (activation checkpointing) | {ac_peak / 2**20:.1f} MiB | {plain_peak / 2**20:.1f} MiB | {ac_peak / plain_peak:.3f} | < 1 |"
        )
    print(
        f"| step time (activation checkpointing) | {ac_time * 1e3:.2f} ms | {plain_time * 1e3:.2f} ms | {ac_time / plain_time:.3f} | ~1.3 (one more forward) |"
    )
    print(
        f"| step time (compile, {backend}) | {compiled_time * 1e3:.2f} ms | {plain_time * 1e3:.2f} ms | {compiled_time / plain_time:.3f} | <= 1 |"
    )
    print(
        f"| step time (both) | {both_time * 1e3:.2f} ms | {plain_time * 1e3:.2f} ms | {both_time / plain_time:.3f} | |"
    )


if __name__ == "__main__":
    main()
