"""The policy's life before step 1, in one place: built, transformed, sharded, materialized, initialized.

A policy is built on `torch.device("meta")`, where a tensor has a shape and a dtype but no storage, so
no rank ever holds a full copy of a model it only trains a shard of. Then, in this order:

1. `build` (every run): the module tree on meta, the wrap plan, activation checkpointing and compile
   applied to the units (distributed/units.py), all before sharding;
2. `before_prepare`: a run that does not shard (one process, DDP) materializes its whole policy now,
   on its device; a sharded run materializes only `--accelerator.fsdp.ignored_modules` (accelerate
   moves them to the device, which a meta tensor cannot do);
3. `prepare()` (distributed/factory.py) shards every wrap unit and the root through accelerate,
   still on meta: each parameter becomes a DTensor of this rank's shard's shape;
4. `after_prepare`: a sharded run allocates its local shards (`to_empty`) and initializes them.

Initialization does not depend on the topology. Each module that owns tensors is initialized on its
own, on a full-shape twin on the CPU (a second meta build, `shadow`), by its `reset_parameters()` (or
the policy's `initialize_module`: SmolVLA's transformers modules use transformers' own initializer) under
a generator seeded from (`--seed`, the module's path); its values are then copied into the module's
local shard and the twin's storage is freed. One process, DDP and every FSDP2/HSDP mesh thus start
from the same bits, and no rank holds more than its shard plus one module's full tensors. Buffers that
are computed rather than learned (ACT's sinusoidal table, frozen batch-norm statistics) are
recomputed the same way: every module owning a tensor must define `reset_parameters()` for its own
tensors, as torch's layers do.

`--policy.path` weights go into the materialized tensors, each rank reading only the blocks its shards
hold (`ckpt_tools.training.load_model_weights`), after their names and shapes are checked against the meta
policy from the files' headers, before anything is allocated. The tensors they fill are never
initialized: only the rest (computed buffers, a PEFT run's adapters) is drawn. Another tool's names
(LeRobot's pi0) are read under the renaming its adapter gives (`LeRobotAdapter.names_from_lerobot`).

A PEFT run (`--peft.*`) builds on meta too: the policy and its twin are wrapped with LoRA on meta
(engine/peft_policy.py), the adapters are initialized per module like the rest, as peft draws them
(`AdapterInitializer`), and `--policy.path` (the base) streams into the frozen base under its names
inside the wrapper.

The eager build (the policy constructed whole on every rank, as before this module) remains for what
meta cannot build yet: an adapter given as `--policy.path` (merged into its base), PEFT runs with
`--peft.full_training_modules` (their copies start as the loaded base) or with adapters peft keeps in
tensors of its own (LoRA on an embedding), a policy's pretrained parts (ACT's camera trunk), another
tool's checkpoint renamed beyond names (LeRobot's ACT: fused projections split), tied weights, and a
plug-in policy whose `__init__` fails on meta or which owns a tensor without a `reset_parameters()`
(a one-line note names the module and the fix). Eager builds are
topology-independent too (every rank builds the same full policy from the same seed); they only cost a
full copy per rank.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from trainer.config.sections import PolicySection
from trainer.distributed.units import apply_unit_transforms
from trainer.distributed.wrap import WrapPlan, resolve_wrap_plan
from trainer.engine import peft_policy as peft
from trainer.policies import build_policy
from trainer.policies.common import pretrained
from trainer.policies.common.base import Policy

META = torch.device("meta")


class Initializer(Protocol):
    """What initializes the modules of a meta build: the policy itself (`Policy.initializes` and
    `Policy.initialize_module`), or for a PEFT run its adapters' rule over the policy's
    (`peft_policy.AdapterInitializer`)."""

    def initializes(self, module: nn.Module) -> bool: ...

    def initialize_module(self, module: nn.Module) -> None: ...


@dataclass
class Shadow:
    """The full-shape meta twin of the module a meta build trains, wrapped as it is (so its module
    names are the same), and what initializes its modules."""

    module: nn.Module
    initializer: Initializer


@dataclass
class BuiltPolicy:
    """What `build` made. `policy` is the module the run trains (the policy, or its PEFT wrapper),
    `base` the policy inside it; `shadow` is the full-shape meta twin that initializes a meta build
    (None for an eager build, whose tensors are already real); `saved_names`, the base's tensors by
    their names in `--policy.path` when those are LeRobot's (`LeRobotAdapter.names_from_lerobot`)."""

    policy: nn.Module
    base: Policy
    wrap_plan: WrapPlan | None
    shadow: Shadow | None
    sharded: bool
    saved_names: dict[str, str] | None = None

    @property
    def on_meta(self) -> bool:
        return self.shadow is not None


def build(
    section: PolicySection, sharded: bool, obs_dim: int, action_dim: int, notes: list[str]
) -> BuiltPolicy:
    """The module tree the run trains, on meta when it can be (else eager, with a note when a plug-in
    is the reason), with the unit transforms applied; nothing sharded or allocated yet."""
    on_meta, reason = _build_on_meta(section, sharded, obs_dim, action_dim)
    if reason:
        notes.append(reason)
    saved_names = None
    if on_meta is not None:
        policy, base, shadow, saved_names = on_meta
    else:
        base = build_policy(section.policy, obs_dim, action_dim)
        policy, shadow = peft.start_policy(base, section, sharded), None
    units = section.units
    wrap_plan = resolve_wrap_plan(policy, units.fsdp) if sharded else None
    unit_plan = wrap_plan or (resolve_wrap_plan(policy, units.fsdp) if units.transforms_units else None)
    notes.extend(apply_unit_transforms(policy, unit_plan, units, sharded))  # before sharding
    return BuiltPolicy(policy, base, wrap_plan, shadow, sharded, saved_names)


def before_prepare(built: BuiltPolicy, section: PolicySection, device: torch.device) -> None:
    """Materialize and initialize what must be real before `prepare()`: the whole policy of a run that
    does not shard (then `--policy.path` weights are read into it, one tensor at a time), the ignored
    modules of one that does."""
    if not built.on_meta:
        return
    if not built.sharded:
        _materialize_and_load(built, section, device)
        return
    pattern = section.units.fsdp.ignored_modules
    if pattern is not None:
        regex = re.compile(pattern)
        ignored = [name for name, _ in built.policy.named_modules() if name and regex.fullmatch(name)]
        _materialize(built, device, lambda name: any(_within(name, root) for root in ignored), section.seed)


def after_prepare(built: BuiltPolicy, section: PolicySection, device: torch.device) -> None:
    """Collective (with --policy.path). Allocate a sharded run's local shards, initialize them (its
    ignored modules again, with the same values), then read `--policy.path` weights into them."""
    if built.on_meta and built.sharded:
        on = torch.device("cpu") if section.units.fsdp.cpu_offload else device
        _materialize_and_load(built, section, on)  # each rank reads its own blocks


def _materialize_and_load(built: BuiltPolicy, section: PolicySection, device: torch.device) -> None:
    """Allocate the whole policy on `device`, initialize what `--policy.path` does not fill (without
    it, everything), then stream its weights in. The tensors it fills are never drawn: at pi0.5's size
    that skips 3.35 B random draws and, per rank, the token table's full initial values (2.1 GB in
    float32) that initializing it would hold for a moment."""
    path = section.policy.path
    if path is None:
        _materialize(built, device, lambda name: True, section.seed)
        return
    names = _pretrained_names(built, section)  # None: every tensor, under its own name
    filled = frozenset(names if names is not None else built.policy.state_dict())
    _materialize(built, device, lambda name: True, section.seed, filled)
    pretrained.stream_weights(built.policy, path, names)


def _pretrained_names(built: BuiltPolicy, section: PolicySection) -> dict[str, str] | None:
    """The tensors `--policy.path` fills -> the names they are saved under, or None when it fills every
    tensor under its own name: a PEFT run's frozen base under the names inside the wrapper (the
    adapters keep their initialization), another tool's checkpoint under its names."""
    names = peft.base_weight_names(built.policy) if section.peft.enabled else None
    if built.saved_names is not None:  # another tool's names: each base tensor under its saved name
        base = names or {name: name for name in built.saved_names}
        names = {name: built.saved_names[base_name] for name, base_name in base.items()}
    return names


def build_policy_on_meta(section: PolicySection, obs_dim: int, action_dim: int) -> Policy:
    """`build_policy` under the meta device: shapes and dtypes, no storage."""
    with META:
        return build_policy(section.policy, obs_dim, action_dim)


def _build_on_meta(
    section: PolicySection, sharded: bool, obs_dim: int, action_dim: int
) -> tuple[tuple[nn.Module, Policy, Shadow, dict[str, str] | None] | None, str]:
    """(the module the run trains, its policy, their shadow, `BuiltPolicy.saved_names`), all on meta (a
    PEFT run's wrapped with `--peft.*`), or (None, why not): "" when the run's own flags ask for an
    eager build, a note line naming the module and the fix when the policy cannot be built on meta."""
    policy, saved_names, reason = _policy_on_meta(section, obs_dim, action_dim)
    if policy is None:
        return None, reason
    twin = build_policy_on_meta(section, obs_dim, action_dim)
    if not section.peft.enabled:
        return (policy, policy, Shadow(twin, twin), saved_names), ""
    model, wrapped_twin = peft.wrap_policy(policy, section, sharded), peft.wrap_policy(twin, section, sharded)
    shadow = Shadow(wrapped_twin, peft.AdapterInitializer(wrapped_twin, twin))
    missing = uninitializable_modules(wrapped_twin, shadow.initializer)
    if missing:  # an adapter peft keeps in its own tensors (LoRA on an embedding): built on a real base
        name, module = missing[0]
        return None, (
            f"{type(module).__name__} at {name}: --peft.* adds tensors the meta build cannot initialize, "
            "so the policy and its adapters are built whole on every rank; target linear layers only "
            "(--peft.target_modules) to build it sharded"
        )
    return (model, policy, shadow, saved_names), ""


def _policy_on_meta(
    section: PolicySection, obs_dim: int, action_dim: int
) -> tuple[Policy | None, dict[str, str] | None, str]:
    """The policy built on meta and `BuiltPolicy.saved_names`, or `_eager(why not)` as `_build_on_meta`
    says it."""
    path = section.policy.path
    if path is not None and pretrained.is_adapter(path):
        return _eager()  # an adapter merged whole into its base (pretrained.read_weights)
    if section.peft.full_training_modules:
        return _eager()  # their copies start as the loaded base, which the meta build streams by name only
    try:
        policy = build_policy_on_meta(section, obs_dim, action_dim)
    except Exception as exc:  # a plug-in's __init__ that reads or computes real values
        built = section.policy.policy_class()
        return _eager(
            f"{getattr(built, '__qualname__', type(built).__name__)}: the policy could not be built on the meta device "
            f"({type(exc).__name__}: {' '.join(str(exc).split())[:160]}), so every rank builds it whole; "
            "keep __init__ free of reads and computations on tensors (do them in reset_parameters())"
        )
    if path is None and policy.loads_pretrained_parts():
        return _eager()
    missing = uninitializable_modules(policy, policy)
    if missing:
        name, module = missing[0]
        return _eager(
            f"{type(module).__name__} at {name or '<root>'} owns tensors but defines no reset_parameters(), "
            "so the policy is built whole on every rank; define reset_parameters() initializing its own "
            "parameters and buffers to build it sharded (docs/large-models.md)"
        )
    if _has_tied_parameters(policy):
        return _eager()
    if path is None:
        return policy, None, ""
    shapes = pretrained.saved_shapes(path)  # the headers: nothing is allocated before they fit
    saved_names = None
    adapter = policy.config.lerobot_adapter()
    if adapter is not None and adapter.is_lerobot_state(list(shapes)):
        saved_names = adapter.names_from_lerobot(list(shapes))
        if saved_names is None:
            return _eager()  # renamed beyond names (LeRobot's ACT): read whole as the eager build reads it
    pretrained.check_fits(policy, path, shapes, saved_names)
    return policy, saved_names, ""


def _eager(why: str = "") -> tuple[None, None, str]:
    """`_policy_on_meta`'s answer for an eager build: "" when the run's own flags ask for one."""
    return None, None, why


def uninitializable_modules(model: nn.Module, initializer: Initializer) -> list[tuple[str, nn.Module]]:
    """Modules of `model` that own a parameter or buffer `initializer` cannot initialize (a policy's,
    by default: no `reset_parameters()`; `Policy.initializes`)."""
    return [
        (name, module)
        for name, module in model.named_modules()
        if _own_tensors(module) and not initializer.initializes(module)
    ]


def _has_tied_parameters(policy: nn.Module) -> bool:
    """`to_empty` gives each holder of a shared parameter its own storage, which would untie it."""
    ids = [id(p) for _, p in policy.named_parameters(remove_duplicate=False)]
    return len(ids) != len(set(ids))


def _own_tensors(module: nn.Module) -> list[str]:
    return [name for name, _ in module.named_parameters(recurse=False)] + [
        name for name, _ in module.named_buffers(recurse=False)
    ]


def _within(name: str, root: str) -> bool:
    return name == root or name.startswith(root + ".")


def _materialize(
    built: BuiltPolicy,
    device: torch.device,
    selected: object,
    seed: int,
    filled: frozenset[str] = frozenset(),
) -> None:
    """Allocate the selected modules' tensors on `device` and initialize them from the shadow twin, but
    for the tensors named in `filled` (a checkpoint's, read in next)."""
    assert built.shadow is not None and callable(selected)
    modules = dict(built.policy.named_modules())
    for name, module in modules.items():
        if selected(name):
            module.to_empty(device=device, recurse=False)
    for name, twin in built.shadow.module.named_modules():
        drawn = [t for t in _own_tensors(twin) if (f"{name}.{t}" if name else t) not in filled]
        if drawn and selected(name):
            _initialize_module(built.shadow.initializer, twin, modules[name], module_seed(seed, name), drawn)


def module_seed(seed: int, name: str) -> int:
    """The seed of one module's initialization: a stable function of the run's seed and its path."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


@torch.no_grad()
def _initialize_module(
    initializer: Initializer, twin: nn.Module, target: nn.Module, seed: int, drawn: list[str]
) -> None:
    """Initialize `twin` (a module of the shadow)'s own tensors named in `drawn` at full shape on the
    CPU, copy them into `target`'s (its local shard of each), then free the twin's storage again. The
    twin's other tensors stay on meta, where the initializer's writes to them cost nothing."""
    for name in drawn:
        _allocate_on_cpu(twin, name)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        initializer.initialize_module(twin)
    for name in drawn:
        _copy_into(getattr(target, name), getattr(twin, name))
    twin.to_empty(device=META, recurse=False)


def _allocate_on_cpu(module: nn.Module, name: str) -> None:
    """Give one of `module`'s own parameters or buffers uninitialized CPU storage (`to_empty`, for one)."""
    if name in module._parameters:
        param = module._parameters[name]
        assert param is not None
        module._parameters[name] = nn.Parameter(torch.empty_like(param, device="cpu"), param.requires_grad)
    else:
        module._buffers[name] = torch.empty_like(module.get_buffer(name), device="cpu")


def _copy_into(target: torch.Tensor, full: torch.Tensor) -> None:
    """Copy a full-shape tensor into `target`: whole, or this rank's shard of it when `target` is a
    DTensor (sliced locally, `src_data_rank=None`: no communication)."""
    if isinstance(target, DTensor):
        local = distribute_tensor(
            full.to(target.dtype), target.device_mesh, target.placements, src_data_rank=None
        )
        target.to_local().copy_(local.to_local())
    else:
        target.copy_(full)
