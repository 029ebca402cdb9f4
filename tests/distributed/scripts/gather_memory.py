"""`trainer train` through the real CLI, with each rank's resident memory read around its FSDP2 units'
gathers in the first training forward, and the gathers of its first backward pass listed.

Usage: torchrun --nproc-per-node=N gather_memory.py OUT_PREFIX [trainer flags]

The engine's `prepare` is wrapped (nothing else changes). A hook before FSDP2's own pre-forward hook
of each hidden block (`model.blocks.*`) resets VmHWM to VmRSS and notes VmRSS; one after the block's
forward notes the peak since. Each rank writes OUT_PREFIX.rank<R>.json: per block, in forward order,
[VmRSS before its gather, VmHWM up to the end of its forward] in KiB (first training forward only).
In the backward pass each gather FSDP2 starts is noted with the unit whose backward was starting
then (FSDP2's `FSDPParamGroup`, torch internals: what a prefetch is cannot be read from memory alone,
whose timing depends on gloo's thread): OUT_PREFIX.backward.rank<R>.json lists [unit gathered, unit
whose backward starts] until the optimizer steps.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

import trainer.engine.startup
from trainer.cli import main
from trainer.distributed.factory import prepare


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))


def _watch(block: torch.nn.Module, name: str, seen: dict[str, list[int]]) -> None:
    def before_gather(_module, _args) -> None:
        if name not in seen:
            with open("/proc/self/clear_refs", "w") as clear:
                clear.write("5")  # VmHWM := VmRSS
            seen[name] = [_status_kib("VmRSS")]

    def after_forward(_module, _args, _output) -> None:
        if len(seen[name]) == 1:
            seen[name].append(_status_kib("VmHWM"))

    block.register_forward_pre_hook(before_gather, prepend=True)  # before FSDP2's unshard
    block.register_forward_hook(after_forward)  # after FSDP2's reshard


def _list_backward_gathers(gathers: list[list[str]]) -> None:
    """Each gather started during a unit's pre-backward: [the unit gathered, that unit]."""
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    pre_backward, unshard = FSDPParamGroup.pre_backward, FSDPParamGroup.unshard
    starting: list[str] = []

    def noting_pre_backward(group, *args, **kwargs):
        starting.append(group._module_fqn)
        try:
            return pre_backward(group, *args, **kwargs)
        finally:
            starting.pop()

    def noting_unshard(group, *args, **kwargs):
        if starting and not group.is_unsharded and group._all_gather_result is None:
            gathers.append([group._module_fqn, starting[-1]])
        return unshard(group, *args, **kwargs)

    FSDPParamGroup.pre_backward = noting_pre_backward
    FSDPParamGroup.unshard = noting_unshard


def observe(prefix: str):
    def wrapped(accelerator, policy, optimizer, scheduler, wrap_plan):
        model, optimizer, scheduler = prepare(accelerator, policy, optimizer, scheduler, wrap_plan)
        seen: dict[str, list[int]] = {}
        for name, module in model.named_modules():
            if isinstance(module, FSDPModule) and ".blocks." in f".{name}":
                _watch(module, name, seen)

        def write(_module, _args, _output) -> None:
            with open(f"{prefix}.rank{dist.get_rank()}.json", "w") as file:
                json.dump(seen, file)

        gathers: list[list[str]] = []
        _list_backward_gathers(gathers)

        def write_backward(*_args) -> None:
            with open(f"{prefix}.backward.rank{dist.get_rank()}.json", "w") as file:
                json.dump(gathers, file)

        model.register_forward_hook(write)
        optimizer.optimizer.register_step_pre_hook(write_backward)
        return model, optimizer, scheduler

    return wrapped


if __name__ == "__main__":
    prefix, flags = sys.argv[1], sys.argv[2:]
    trainer.engine.startup.prepare = observe(prefix)
    main(["train", *flags])
