"""`trainer train` through the real CLI, with what FSDP2 made of the --accelerator.fsdp.* knobs recorded.

Usage: torchrun --nproc-per-node=N train_fsdp_knobs.py OBSERVED_PREFIX [trainer flags]

The loop's `prepare` and `evaluate` are wrapped (nothing else changes). Each rank writes
OBSERVED_PREFIX.rank<R>.pt with
  units        per FSDP unit (module path, "" is the root): the MixedPrecisionPolicy it holds, its
               offload policy, whether torch reshards it after forward;
  params       per parameter: "DTensor" (sharded) or "Tensor" (ignored: kept whole on every rank);
  forward      from the first training forward, after the root's forward returned: per non-root unit,
               whether its parameters are still unsharded, the dtype and shape of a parameter as the
               module holds it then, and the dtype of the unit's output;
  plain_after  the plain (unsharded) parameters' values after the last step, for a cross-rank check;
  plain_grads  per plain trainable parameter, the first backward's gradient as this rank computed it
               ("local") and as `.grad` holds it after the trainer's hooks ("accumulated").
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

import trainer.engine.loop
import trainer.engine.startup
from trainer.cli import main
from trainer.distributed.factory import prepare


def _unit_facts(module: FSDPModule) -> dict:
    """What torch holds for one unit, read from its FSDP state and parameter group."""
    group = module._get_fsdp_state()._fsdp_param_group
    mp = module._get_fsdp_state()._mp_policy
    return {
        "mp_policy": {
            "param_dtype": str(mp.param_dtype),
            "reduce_dtype": str(mp.reduce_dtype),
            "output_dtype": str(mp.output_dtype),
            "cast_forward_inputs": mp.cast_forward_inputs,
        },
        "group_mp_is_state_mp": group is None or group.mp_policy is mp,
        "offload": None if group is None else type(group.offload_policy).__name__,
        "pin_memory": getattr(getattr(group, "offload_policy", None), "pin_memory", None),
        "offload_to_cpu": None if group is None else [p.offload_to_cpu for p in group.fsdp_params],
        "reshard_after_forward": None if group is None else group.post_forward_mesh_info is not None,
        "num_params": 0 if group is None else len(group.fsdp_params),
    }


def _watch_first_forward(model: torch.nn.Module, units: dict[str, FSDPModule], seen: dict) -> None:
    """Hooks registered after fully_shard run after FSDP's own: the root's fires once every unit's
    post-forward (reshard or not) is done."""

    def unit_hook(name: str):
        def hook(_module, _inputs, output) -> None:
            seen.setdefault("output_dtype", {}).setdefault(name, str(output.dtype))

        return hook

    def root_hook(_module, _inputs, _output) -> None:
        if "unsharded" in seen:
            return
        seen["unsharded"] = {n: u._get_fsdp_state()._fsdp_param_group.is_unsharded for n, u in units.items()}
        seen["held_param"] = {}
        for name, unit in units.items():
            pname, param = _first_held(unit)
            seen["held_param"][name] = (pname, type(param).__name__, str(param.dtype), tuple(param.shape))

    for name, unit in units.items():
        unit.register_forward_hook(unit_hook(name))
    model.register_forward_hook(root_hook)


def _first_held(unit: torch.nn.Module) -> tuple[str, torch.Tensor]:
    """The first parameter as its module holds it now (`getattr`, which is what forward reads)."""
    for mname, sub in unit.named_modules():
        for pname in sub._parameters:
            return f"{mname}.{pname}".lstrip("."), getattr(sub, pname)
    raise AssertionError("unit without parameters")


def _watch_first_plain_gradients(model: torch.nn.Module, seen: dict) -> None:
    """For each trainable whole (ignored) parameter, its first backward's gradient as this rank computed
    it (a tensor hook runs before accumulation) and as `.grad` holds it once accumulated (a hook added
    after the trainer's own runs after it)."""
    for name, param in model.named_parameters():
        if isinstance(param, DTensor) or not param.requires_grad:
            continue
        entry = seen.setdefault(name, {})
        param.register_hook(_keep_first(entry, "local"))
        param.register_post_accumulate_grad_hook(
            lambda p, keep=_keep_first(entry, "accumulated"): keep(p.grad)
        )


def _keep_first(entry: dict, key: str):
    def keep(grad: torch.Tensor) -> None:
        if key not in entry:
            entry[key] = grad.detach().clone()

    return keep


def observe(prefix: str, record: dict):
    def wrapped(accelerator, policy, optimizer, scheduler, wrap_plan):
        model, optimizer, scheduler = prepare(accelerator, policy, optimizer, scheduler, wrap_plan)
        units = {n: m for n, m in model.named_modules() if isinstance(m, FSDPModule)}
        record["units"] = {n: _unit_facts(m) for n, m in units.items()}
        record["params"] = {
            n: "DTensor" if isinstance(p, DTensor) else "Tensor" for n, p in model.named_parameters()
        }
        record["forward"] = {}
        _watch_first_forward(model, {n: u for n, u in units.items() if n}, record["forward"])
        record["plain_grads"] = {}
        _watch_first_plain_gradients(model, record["plain_grads"])
        return model, optimizer, scheduler

    return wrapped


def evaluate_then_save(prefix: str, record: dict, evaluate):
    def wrapped(accelerator, model, *args, **kwargs):
        record["plain_after"] = {
            n: p.detach().clone() for n, p in model.named_parameters() if not isinstance(p, DTensor)
        }
        torch.save(record, f"{prefix}.rank{dist.get_rank()}.pt")
        return evaluate(accelerator, model, *args, **kwargs)

    return wrapped


if __name__ == "__main__":
    prefix, flags = sys.argv[1], sys.argv[2:]
    record: dict = {}
    trainer.engine.startup.prepare = observe(prefix, record)
    trainer.engine.loop.score_at_end = evaluate_then_save(prefix, record, trainer.engine.loop.score_at_end)
    main(["train", *flags])
