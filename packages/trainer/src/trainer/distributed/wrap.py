"""The FSDP wrap plan: which modules become FSDP units, checked against the policy before sharding.

The plan is the policy's `_fsdp_wrap_modules`, overridden by `--accelerator.fsdp.wrap_modules` or by
the classes of the blocks above `--accelerator.fsdp.min_num_params`. Tied parameters that the plan would place in different units are
an error here, at start, naming them: torch would otherwise fail at the first forward.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from torch import nn
from torch.distributed.tensor import DTensor

from trainer.config.accelerator import FsdpConfig
from trainer.errors import WrapPlanError
from trainer.policies.common.base import policy_of


@dataclass(frozen=True)
class WrapPlan:
    """Units by class name; `min_num_params` records the threshold the classes were chosen by."""

    class_names: tuple[str, ...]
    min_num_params: int | None = None

    def describe(self) -> str:
        classes = ", ".join(self.class_names) or "none (the root alone)"
        if self.min_num_params is None:
            return f"by class: {classes}"
        return f"by size: modules with > {self.min_num_params} parameters ({classes})"


def resolve_wrap_plan(policy: nn.Module, fsdp: FsdpConfig) -> WrapPlan:
    """The plan for a sharded run, or for the per-unit activation checkpointing and compile of any run;
    a policy with neither a declaration nor a flag is refused."""
    if fsdp.min_num_params is not None:
        return WrapPlan(
            class_names=_classes_above(policy, fsdp.min_num_params), min_num_params=fsdp.min_num_params
        )
    present = {type(m).__name__ for m in policy.modules()}
    declaring = policy_of(policy)
    declared = declaring._fsdp_wrap_modules if declaring is not None else ()
    # A declaration may name classes that this configuration of the policy does not build (ACT without
    # cameras has no trunk stages); the classes of a flag must all exist.
    names = tuple(fsdp.wrap_modules or [name for name in declared if name in present])
    if not names:
        raise WrapPlanError(
            f"{type(policy).__name__} declares no _fsdp_wrap_modules, so a sharded run (or activation "
            "checkpointing, or a per-unit compile) would not know its units: set --accelerator.fsdp.wrap_modules=[ClassName,...] or "
            "--accelerator.fsdp.min_num_params=N"
        )
    missing = [name for name in names if name not in present]
    if missing:
        raise WrapPlanError(
            f"wrap module class(es) {', '.join(missing)} not found in {type(policy).__name__} (its classes: "
            f"{', '.join(sorted(present))}): fix --accelerator.fsdp.wrap_modules"
        )
    return WrapPlan(class_names=names)


def _classes_above(policy: nn.Module, min_num_params: int) -> tuple[str, ...]:
    """Size-based units, chosen here rather than by accelerate's size policy, which also selects
    containers (ModuleList, ModuleDict) that fully_shard cannot shard. Walking down from the root,
    the first modules with a forward and more than `min_num_params` parameters are units; containers
    are looked through, and a unit's children are not searched (one unit per block, not per layer
    inside it). FSDP2 through accelerate selects units by class, so the plan is their classes."""
    classes: dict[str, None] = {}  # ordered set
    total = _count(policy)

    def visit(module: nn.Module) -> None:
        for child in module.children():
            has_forward = type(child).forward is not nn.Module.forward
            size = _count(child)
            if (
                has_forward and min_num_params < size < total
            ):  # a wrapper of everything (PEFT) is looked through
                classes[type(child).__name__] = None
            else:
                visit(child)

    visit(policy)
    return tuple(classes)


def _count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def unit_roots(model: nn.Module, plan: WrapPlan) -> list[str]:
    """Module paths that become FSDP units under `plan`; "" (the root) is always one."""
    roots = [""]
    for name, module in model.named_modules():
        if not name:
            continue
        if type(module).__name__ in plan.class_names:
            roots.append(name)
    return roots


def check_tied_weights(model: nn.Module, plan: WrapPlan) -> None:
    """Refuse parameters shared by modules that the plan puts in different FSDP units."""
    roots = unit_roots(model, plan)
    names_by_param: dict[int, list[str]] = defaultdict(list)
    for name, param in model.named_parameters(remove_duplicate=False):
        names_by_param[id(param)].append(name)
    for names in names_by_param.values():
        units = {_owning_unit(name, roots) for name in names}
        if len(units) > 1:
            raise WrapPlanError(
                f"tied parameters {', '.join(names)} would be split across FSDP units "
                f"{', '.join(repr(u or '<root>') for u in sorted(units))}: untie them, or choose wrap units "
                "that keep them together (--accelerator.fsdp.wrap_modules)"
            )


def _owning_unit(param_name: str, roots: list[str]) -> str:
    module_path = param_name.rpartition(".")[0]
    best = ""
    for root in roots:
        if root and (module_path == root or module_path.startswith(root + ".")) and len(root) > len(best):
            best = root
    return best


def register_forward_methods(model: nn.Module) -> None:
    """Let `_fsdp_forward_methods` (e.g. select_action) gather the sharded parameters like forward."""
    from torch.distributed.fsdp import register_fsdp_forward_method

    declaring = policy_of(model)
    for name in declaring._fsdp_forward_methods if declaring is not None else ():
        register_fsdp_forward_method(model, name)


def describe_parameters(model: nn.Module) -> str:
    """How the prepared parameters are laid out: DTensor placements on a sharded run."""
    param = next(model.parameters())
    if not isinstance(param, DTensor):
        return f"parameters: plain tensors ({type(model).__name__})"
    return (
        f"parameters: DTensor placements {tuple(param.placements)} on mesh {param.device_mesh.mesh_dim_names}"
    )
