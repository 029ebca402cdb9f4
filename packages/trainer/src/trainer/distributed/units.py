"""Activation checkpointing and torch.compile, applied to the wrap units in place before `prepare()`.

Both change how a unit runs, never what it holds: the unit's `forward` is replaced on the instance
(checkpointing) and `nn.Module.compile()` compiles its call in place, so the module tree, and with it
every state_dict key a checkpoint saves, stays the plain policy's. `torch.compile(module)` and torch's
`checkpoint_wrapper` would add `_orig_mod.` and `_checkpoint_wrapped_module.` to the keys instead, and
a compiled run's checkpoint would no longer load into a plain policy (or the reverse) without renaming.

Applied before FSDP2's `fully_shard` (the order torch documents: checkpoint, compile, shard), each unit
keeps its own forward hooks, so FSDP gathers its parameters before the recomputation in backward.
"""

from __future__ import annotations

from torch import nn

from trainer.config.accelerator import UnitSettings
from trainer.distributed.wrap import WrapPlan, unit_roots
from trainer.errors import ConfigError
from trainer.policies.common.checkpointing import checkpointed


def apply_unit_transforms(
    policy: nn.Module, plan: WrapPlan | None, settings: UnitSettings, sharded: bool
) -> list[str]:
    """Checkpoint, then compile, the plan's units (or the whole policy for `compile_scope=model`);
    returns the banner lines that say what was applied ([] when neither flag is set)."""
    if settings.compile and settings.compile_scope == "model" and sharded:
        raise ConfigError(
            "--accelerator.compile_scope=model compiles around FSDP's root unit, which this trainer does "
            "not support on a sharded run: use --accelerator.compile_scope=units"
        )
    lines: list[str] = []
    units: list[nn.Module] = []
    described = ""
    if settings.transforms_units:
        if plan is None:
            raise ValueError("per-unit transforms need the wrap plan (distributed.wrap.resolve_wrap_plan)")
        modules = dict(policy.named_modules())
        units = [modules[name] for name in unit_roots(policy, plan) if name]
        described = plan.describe()
    if settings.activation_checkpointing:
        for unit in units:
            unit.forward = checkpointed(unit.forward)
        lines.append(f"activation checkpointing: {len(units)} units ({described})")
    if settings.compile:
        targets = units if settings.compile_scope == "units" else [policy]
        mode = None if settings.compile_mode == "default" else settings.compile_mode
        for target in targets:
            target.compile(backend=settings.compile_backend, mode=mode)
        where = f"{len(targets)} units" if settings.compile_scope == "units" else "the whole policy"
        lines.append(
            f"torch.compile: {where}, backend {settings.compile_backend}, mode {settings.compile_mode}"
        )
    return lines
