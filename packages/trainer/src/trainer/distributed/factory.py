"""The one place that configures accelerate: environment guard, Accelerator construction, prepare().

Everything accelerate-specific that the loop needs is built here from the config, so the loop has no
branch on the topology. The CPU adapters (`_engage_fsdp_on_cpu`, `_engage_fp16_on_cpu`) are the only
code that reaches into accelerate's state; tests/training/test_accelerate_canaries.py pins the internals
they rely on. On CPU, `_free_each_gather_at_copy_out` turns on FSDP2's own (underscored) async
unshard, `_gather_each_unit_when_its_backward_starts` turns off its backward prefetch and
`_release_each_unit_after_its_recompute` ungathers a unit recomputed inside a checkpointed region;
tests/distributed/test_gather_memory.py and test_fastwam_sharded.py pin what they buy.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator, Mapping
from typing import Any, cast

from ckpt_tools.training import Topology
from trainer.config.sections import ParallelismSection
from trainer.distributed.wrap import WrapPlan, check_tied_weights, register_forward_methods
from trainer.errors import ConfigError, backend_detail

ALLOW_ENV = "TRAINER_ALLOW_ACCELERATE_ENV"
# accelerate reads its configuration from ACCELERATE_* (and FSDP_*, PARALLELISM_CONFIG_*) variables,
# which `accelerate launch` exports from its config file: every one of them is refused (they would
# silently change the run, e.g. ACCELERATE_DYNAMO_BACKEND compiles the model) except those below.
GUARDED_PREFIXES = ("ACCELERATE_", "FSDP_", "PARALLELISM_CONFIG_")
# Variables that change how a run is reported or pinned to cores, never what it computes; the dynamo
# options only shape a compile that ACCELERATE_DYNAMO_BACKEND (guarded) would switch on.
INERT_NAMES = frozenset(
    {
        "ACCELERATE_LOG_LEVEL",
        "ACCELERATE_DEBUG_MODE",
        "ACCELERATE_ENABLE_RICH",
        "ACCELERATE_CPU_AFFINITY",
        "ACCELERATE_DEBUG_RDV_FILE",
        "ACCELERATE_DYNAMO_MODE",
        "ACCELERATE_DYNAMO_USE_FULLGRAPH",
        "ACCELERATE_DYNAMO_USE_DYNAMIC",
        "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION",
    }
)
MESH_SLICING_WARNING = r"Slicing a flattened dim from root mesh will be deprecated"
LINEAR_VIEW_WARNING = r"FSDP2-wrapped module \(FSDPLinear\) returned a view tensor"
# Values a plain `accelerate launch` (no config file) exports; they change nothing, so they pass.
INERT_VALUES = {
    "ACCELERATE_USE_FSDP": "false",
    "ACCELERATE_USE_PARALLELISM_CONFIG": "false",
    "ACCELERATE_MIXED_PRECISION": "no",
    "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "1",
    "ACCELERATE_DYNAMO_BACKEND": "no",
    "ACCELERATE_USE_CPU": "false",
    "ACCELERATE_USE_DEEPSPEED": "false",
    "ACCELERATE_USE_MEGATRON_LM": "false",
}


def _guarded(name: str) -> bool:
    return name.startswith(GUARDED_PREFIXES) and name not in INERT_NAMES


def check_accelerate_env(environ: Mapping[str, str] = os.environ) -> None:
    """Refuse accelerate configuration variables: they would silently override the run's flags."""
    if environ.get(ALLOW_ENV) == "1":
        return
    found = sorted(
        name
        for name, value in environ.items()
        if _guarded(name) and INERT_VALUES.get(name) != value.strip().lower()
    )
    if found:
        raise ConfigError(
            f"accelerate configuration variables are set ({', '.join(found)}) and would override this run's "
            f"flags: unset them and use --parallelism.* / --accelerator.* instead, or set {ALLOW_ENV}=1"
        )


@contextlib.contextmanager
def _no_leaked_env() -> Iterator[None]:
    """`Accelerator.__init__` exports ACCELERATE_USE_FSDP (and FSDP_* for some plugin fields); drop
    them afterwards so they neither trip the guard of a later run in this process nor switch
    accelerate's FSDP1-style code paths (clip_grad_norm_) on for an FSDP2 model."""
    before = {name: value for name, value in os.environ.items() if _guarded(name)}
    try:
        yield
    finally:
        for name in [n for n in os.environ if _guarded(n)]:
            if name not in before:
                del os.environ[name]
        os.environ.update(before)


def build_accelerator(parallelism: ParallelismSection, wrap_plan: WrapPlan | None) -> Any:
    """Collective: call on all ranks. The Accelerator for this run (it also joins the process group)."""
    import torch
    from accelerate import Accelerator

    check_accelerate_env()
    _quiet_mesh_slicing_warning()
    acc, topology, timeout_s = parallelism.accelerator, parallelism.topology, parallelism.collective_timeout_s
    on_cpu = not torch.cuda.is_available()
    kwargs: dict[str, Any] = {
        # accelerate only treats a CPU-only torchrun launch as distributed (gloo) when told `cpu=True`.
        "cpu": on_cpu,
        "mixed_precision": acc.mixed_precision,
        "gradient_accumulation_plugin": acc.gradient_accumulation.build_plugin(),
        "step_scheduler_with_optimizer": False,
        "kwargs_handlers": [acc.ddp.build_kwargs(), _process_group_kwargs(timeout_s)],
    }
    with _no_leaked_env(), _single_process_alone(topology), _joining(timeout_s):
        if not topology.is_sharded:
            accelerator = Accelerator(**kwargs)
        else:
            if wrap_plan is None:
                raise ValueError("a sharded run needs its wrap plan (distributed.wrap.resolve_wrap_plan)")
            plugin = acc.fsdp.build_plugin(wrap_plan.class_names, on_cpu)
            mesh = _parallelism_config(topology)
            if not on_cpu:
                return Accelerator(**kwargs, fsdp_plugin=plugin, parallelism_config=mesh)
            accelerator = Accelerator(**kwargs)
            _engage_fsdp_on_cpu(accelerator, plugin, mesh)
    if on_cpu and acc.mixed_precision == "fp16":
        _engage_fp16_on_cpu(accelerator)
    return accelerator


# What torchrun exports to each process; accelerate takes any LOCAL_RANK for a distributed launch.
LAUNCHER_ENV = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK")


@contextlib.contextmanager
def _single_process_alone(topology: Topology) -> Iterator[None]:
    """A one-process torchrun (or `accelerate launch`) runs as a plain single process: accelerate
    would otherwise join a process group of one and wrap the policy in DDP, whose gradient buckets
    and initial broadcast cost a copy of the gradients (4 B per parameter: 1.25x the ideal peak of a
    470 M policy). The launcher's variables are hidden while the Accelerator is built, then restored."""
    if topology.dp_world_size > 1:
        yield
        return
    hidden = {name: os.environ.pop(name) for name in LAUNCHER_ENV if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(hidden)


@contextlib.contextmanager
def _joining(timeout_s: int) -> Iterator[None]:
    """Joining the process group (inside the Accelerator's construction) fails as one line: a rank that
    never joins (it failed first, or started late on a loaded machine) makes the others' rendezvous or
    gloo's connect time out before the group exists, which is no collective failure the CLI knows."""
    import torch.distributed as dist

    try:
        yield
    except RuntimeError as exc:  # torch's store and backend errors (DistError is one)
        if dist.is_initialized() or int(os.environ.get("WORLD_SIZE", "1")) < 2:
            raise
        detail = backend_detail(exc)
        raise ConfigError(
            f"rank {os.environ.get('RANK', '0')}: the ranks did not all join the process group within "
            f"--collective_timeout_s={timeout_s} ({detail}): a rank failed before joining (its own line "
            "says why) or started that much later than the others (raise --collective_timeout_s)"
        ) from None


def _process_group_kwargs(timeout_s: int) -> Any:
    """The process group's collective timeout: a rank waiting for one that failed or stalls gives up
    after `--collective_timeout_s` instead of torch's 30 minutes (gloo and NCCL alike)."""
    from datetime import timedelta

    from accelerate.utils import InitProcessGroupKwargs

    return InitProcessGroupKwargs(timeout=timedelta(seconds=timeout_s))


def _quiet_mesh_slicing_warning() -> None:
    """accelerate 1.15 slices its flattened `dp_shard_cp` mesh dimension from the root mesh, which
    torch 2.13 answers with a deprecation warning on every rank at every prepare: nothing the user can
    act on, so exactly that message is silenced (every other warning still shows)."""
    warnings.filterwarnings("ignore", message=MESH_SLICING_WARNING, category=UserWarning)


def _quiet_linear_view_warning() -> None:
    """FSDP2 warns at every forward of a `Linear` unit whose output is a view, which `F.linear` returns
    by construction for a biased layer on a 3-D input: an in-place op on that view would skip the
    unit's backward hook. Policies that shard each projection (SmolVLA) never modify one in place (their
    FSDP2 losses and gradients equal DDP's: tests/distributed/test_smolvla_sharded.py), so exactly that
    message, for `Linear` units only, is silenced instead of flooding the log every step."""
    warnings.filterwarnings("ignore", message=LINEAR_VIEW_WARNING, category=UserWarning)


def _parallelism_config(topology: Topology) -> Any:
    from accelerate.parallelism_config import ParallelismConfig

    return ParallelismConfig(dp_replicate_size=topology.dp_replicate, dp_shard_size=topology.dp_shard)


def _engage_fsdp_on_cpu(accelerator: Any, plugin: Any, parallelism: Any) -> None:
    """The CPU FSDP adapter. accelerate 1.15 ignores an FSDP plugin on CPU (it wraps DDP) and refuses an
    HSDP ParallelismConfig there, although torch's FSDP2 runs on CPU with gloo. Setting what
    `AcceleratorState` would have set on a GPU (distributed type FSDP, the plugin with its mixed
    precision, the parallelism config and its device mesh) makes `prepare()` run its FSDP2 path
    unchanged: fully_shard on the 1-D or 2-D (dp_replicate, dp_shard) mesh."""
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    state = accelerator.state
    if state.mixed_precision != "no":
        plugin.set_mixed_precision(state.mixed_precision)
    # Every later `AcceleratorState()` copies PartialState's shared dict over its own, as accelerate
    # itself arranges at the end of AcceleratorState.__init__: set the type in both.
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    state.distributed_type = DistributedType.FSDP
    state.fsdp_plugin = plugin
    state.parallelism_config = parallelism
    state.device_mesh = parallelism.build_device_mesh("cpu")


def _engage_fp16_on_cpu(accelerator: Any) -> None:
    """The CPU fp16 adapter. accelerate 1.15 turns fp16 autocast and the loss scaler on only for
    accelerator devices (on CPU it silently trains in fp32), although torch runs float16 autocast and
    `GradScaler("cpu")` on CPU. Setting the two attributes its GPU branch sets, before `prepare()`,
    makes prepare wrap forward in float16 autocast and hand the scaler to the optimizer, and makes
    `backward` / `clip_grad_norm_` scale and unscale: the loss-scaled fp16 path of a GPU run."""
    import torch

    accelerator.native_amp = True
    accelerator.scaler = torch.amp.GradScaler("cpu")


def prepare(
    accelerator: Any, policy: Any, optimizer: Any, scheduler: Any, wrap_plan: WrapPlan | None
) -> tuple:
    """Collective: call on all ranks. One `prepare()` of model, optimizer and scheduler; on a sharded
    run the tied-weight check runs first and the policy's extra entry points are registered after."""
    if wrap_plan is not None:
        check_tied_weights(policy, wrap_plan)
        if "Linear" in wrap_plan.class_names:
            _quiet_linear_view_warning()
    model, optimizer, scheduler = accelerator.prepare(policy, optimizer, scheduler)
    if wrap_plan is not None:
        register_forward_methods(model)
        _average_ignored_gradients(model)
        if accelerator.device.type == "cpu":
            _free_each_gather_at_copy_out(model)
            _gather_each_unit_when_its_backward_starts(model)
            _release_each_unit_after_its_recompute(model)
        if accelerator.native_amp:
            _autocast_forward(accelerator, model)
    return model, optimizer, scheduler


def _free_each_gather_at_copy_out(model: Any) -> None:
    """On CPU, free each unit's all-gather buffer as soon as its weights are copied out of it. In the
    forward pass FSDP2 keeps a unit's buffer (as large as its gathered weights) until the next unit's
    gather is done, so that on a GPU the next gather's copy-in may overlap it on another stream; on CPU
    there are no streams, and the kept buffer only sits beside the next unit's buffer and weights: the
    peak holds three copies of the largest unit instead of two (pi0.5 under LoRA, 4 ranks: 67 MB per
    rank). FSDP2's async unshard frees the buffer at the copy-out and waits on each gather where the
    unit needs it, so on CPU it computes the same, in the same order."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule):
        model._set_unshard_async_op(True)  # applies to every unit under the root


def _gather_each_unit_when_its_backward_starts(model: Any) -> None:
    """On CPU, no unit is gathered ahead of its backward. FSDP2 gathers, when a unit's backward starts,
    the unit that ran before it in the forward pass (so that on a GPU the gather overlaps the backward
    on another stream); on CPU it only sits beside the unit's gathered weights and full gradients: a
    third copy of a large unit at the backward's peak (FastWAM's 44 M-parameter FFN projections: +0.18
    GB per rank in float32). A unit used in the forward pass but not in the backward (frozen, its
    outputs needing no gradient) is even held gathered until the backward ends. FSDP2 has no switch for
    its default prefetch: a unit naming itself, gathered already when its backward starts, prefetches
    nothing."""
    from torch.distributed.fsdp import FSDPModule

    for unit in model.modules():
        if isinstance(unit, FSDPModule):
            unit.set_modules_to_backward_prefetch([unit])


def _release_each_unit_after_its_recompute(model: Any) -> None:
    """On CPU, a unit that activation checkpointing runs again in the backward pass is ungathered as
    soon as that forward ends. FSDP2 keeps every unit it recomputes gathered until the unit's own
    backward, so that on a GPU no second gather waits: recomputing a region that holds several units
    (FastWAM's MoT layer and its projections) holds all of them gathered at once, the video block's
    163 M parameters at LeRobot's widths (0.33 GB per rank in bfloat16, 4 ranks: peak 1.73 GB against
    1.20 GB ideal). A unit whose backward is not under way (its parameter group not in pre-backward:
    not the unit whose backward started the recompute) has its pre-backward hook still to run, which
    gathers it again when its backward starts: one more gather of it per step, one unit gathered at a
    time."""
    import torch
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState, is_bw

    def release(unit: Any, _args: Any, _output: Any) -> None:
        group = unit._get_fsdp_state()._fsdp_param_group
        if is_bw() and group is not None and group._training_state != TrainingState.PRE_BACKWARD:
            unit.reshard()

    for module in model.modules():
        if isinstance(module, FSDPModule):
            cast(torch.nn.Module, module).register_forward_hook(release)  # after FSDP2's own hook


def _average_ignored_gradients(model: Any) -> None:
    """FSDP2 neither shards nor reduces the gradients of `--accelerator.fsdp.ignored_modules`: each rank
    would step them on its own batch and the "kept unsharded" copies would drift apart (saved from rank 0
    only). Averaging each trainable whole-tensor gradient over the data-parallel ranks as it is
    accumulated keeps every copy identical; a mean per micro-batch sums to the mean of the sums."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    world = dist.get_world_size()

    def average(param: Any) -> None:
        dist.all_reduce(param.grad)
        param.grad.div_(world)

    for param in model.parameters():
        if param.requires_grad and not isinstance(param, DTensor):
            param.register_post_accumulate_grad_hook(average)


def _autocast_forward(accelerator: Any, model: Any) -> None:
    """accelerate 1.15's FSDP2 prepare path never wraps forward in autocast (its other paths do), so
    `--accelerator.mixed_precision` would only reach the parameters through the derived FSDP policy, and
    a `--accelerator.fsdp.mixed_precision_policy` (e.g. output_dtype=float32 feeding a bfloat16 unit)
    would run with no autocast at all. Autocast is owned by --accelerator.mixed_precision (DESIGN 5)."""
    import functools

    forward = model.forward

    @functools.wraps(forward)
    def autocast_forward(*args: Any, **kwargs: Any) -> Any:
        with accelerator.autocast():
            return forward(*args, **kwargs)

    model._original_forward = forward
    model.forward = autocast_forward
