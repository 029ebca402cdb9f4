"""Accelerator configuration: plain values that mirror accelerate's objects.

accelerate is imported only inside the `build_*()` methods, so parsing or validating a config never
imports the engine. distributed/factory.py is the one caller of these builders.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainer.errors import ConfigError

MIXED_PRECISION = ("no", "fp16", "bf16")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
COMPILE_SCOPES = ("units", "model")
DTYPES = ("float32", "bfloat16", "float16")
_SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def dtype_flag(flag: str, value: str | None) -> str | None:
    """A dtype flag's value as torch names it (`bfloat16`), typed either way (`bf16` or `bfloat16`)."""
    if value is None:
        return None
    from ckpt_tools import dtype_name

    name = dtype_name(value)
    if name not in DTYPES:
        spellings = ", ".join(f"{name} ({_SHORT[name]})" for name in DTYPES)
        raise ConfigError(f"{flag}={value!r} is not one of {spellings}")
    return name


def _dtype(name: str | None) -> Any:
    import torch

    return None if name is None else getattr(torch, name)


@dataclass
class MixedPrecisionPolicyConfig:
    """torch's FSDP2 `MixedPrecisionPolicy` fields, applied to every FSDP unit.

    When any field is set, the policy is built from these fields alone and replaces the one derived
    from `--accelerator.mixed_precision`.
    """

    param_dtype: str | None = None
    """Dtype of the all-gathered parameters used in forward/backward (float32, bfloat16, float16)."""
    reduce_dtype: str | None = None
    """Dtype of the gradient reduce-scatter; unset follows param_dtype on torch < 2.15."""
    output_dtype: str | None = None
    """Dtype the outputs of each unit's forward are cast to; unset leaves them as computed."""
    cast_forward_inputs: bool | None = None
    """Cast each unit's floating-point forward inputs to param_dtype (torch's default: true)."""

    def __post_init__(self) -> None:
        for name in ("param_dtype", "reduce_dtype", "output_dtype"):
            flag = f"--accelerator.fsdp.mixed_precision_policy.{name}"
            setattr(self, name, dtype_flag(flag, getattr(self, name)))
        if self.is_set and self.param_dtype is None:
            raise ConfigError(
                "--accelerator.fsdp.mixed_precision_policy.* replaces the policy derived from "
                "--accelerator.mixed_precision, so it needs param_dtype too: set "
                "--accelerator.fsdp.mixed_precision_policy.param_dtype"
            )

    @property
    def is_set(self) -> bool:
        return any(
            v is not None
            for v in (self.param_dtype, self.reduce_dtype, self.output_dtype, self.cast_forward_inputs)
        )

    def effective_reduce_dtype(self) -> str | None:
        """What torch will reduce gradients in when reduce_dtype is unset (changed in torch 2.15)."""
        if self.reduce_dtype is not None or self.param_dtype is None:
            return self.reduce_dtype
        import torch

        major, minor = (int(x) for x in torch.__version__.split(".")[:2])
        return self.param_dtype if (major, minor) < (2, 15) else "float32"

    def build(self) -> Any:
        """torch's MixedPrecisionPolicy, or None when the policy follows --accelerator.mixed_precision."""
        if not self.is_set:
            return None
        from torch.distributed.fsdp import MixedPrecisionPolicy

        kwargs: dict[str, Any] = {
            "param_dtype": _dtype(self.param_dtype),
            "reduce_dtype": _dtype(self.reduce_dtype),
            "output_dtype": _dtype(self.output_dtype),
        }
        if self.cast_forward_inputs is not None:
            kwargs["cast_forward_inputs"] = self.cast_forward_inputs
        return MixedPrecisionPolicy(**kwargs)


@dataclass
class FsdpConfig:
    """FSDP2 settings, used when the run is sharded (`--parallelism.dp_shard` > 1)."""

    wrap_modules: list[str] | None = None
    """Module class names that become FSDP units; overrides the policy's `_fsdp_wrap_modules`."""
    min_num_params: int | None = None
    """Choose the units by size instead of by class name: walking down from the policy, the first modules
    with a forward and more than this many parameters (containers such as ModuleList are looked
    through); every module of their classes becomes a unit."""
    reshard_after_forward: bool = True
    """Free each unit's gathered parameters after forward (false keeps them resident until backward)."""
    cpu_offload: bool = False
    """Keep parameters, gradients and optimizer state on CPU."""
    ignored_modules: str | None = None
    """Regex (full match) of module paths kept unsharded."""
    mixed_precision_policy: MixedPrecisionPolicyConfig = field(default_factory=MixedPrecisionPolicyConfig)

    def __post_init__(self) -> None:
        if self.wrap_modules is not None and self.min_num_params is not None:
            raise ConfigError(
                "--accelerator.fsdp.wrap_modules and --accelerator.fsdp.min_num_params both choose the FSDP "
                "units: set only one of them"
            )
        if self.min_num_params is not None and self.min_num_params < 1:
            raise ConfigError(f"--accelerator.fsdp.min_num_params must be >= 1, got {self.min_num_params}")
        if self.ignored_modules is not None:
            import re

            try:
                re.compile(self.ignored_modules)
            except re.error as exc:
                raise ConfigError(
                    f"--accelerator.fsdp.ignored_modules={self.ignored_modules!r} is not a valid regex ({exc})"
                ) from None

    def build_plugin(self, wrap_modules: tuple[str, ...], on_cpu: bool) -> Any:
        """accelerate's FSDP2 plugin for a resolved wrap plan (its unit classes)."""
        from accelerate.utils import FullyShardedDataParallelPlugin
        from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

        # Pinned host memory needs an accelerator: on a CPU-only machine pinning fails.
        offload = CPUOffloadPolicy(pin_memory=not on_cpu) if self.cpu_offload else OffloadPolicy()
        return FullyShardedDataParallelPlugin(
            fsdp_version=2,
            auto_wrap_policy="transformer_based_wrap",
            transformer_cls_names_to_wrap=list(wrap_modules),
            reshard_after_forward=self.reshard_after_forward,
            cpu_offload=offload,
            ignored_modules=self.ignored_modules,
            mixed_precision_policy=self.mixed_precision_policy.build(),
            state_dict_type="SHARDED_STATE_DICT",
        )


@dataclass
class GradientAccumulationConfig:
    """Micro-batches summed before each optimizer update."""

    steps: int = 1
    """Loop steps per optimizer update."""

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ConfigError(f"--accelerator.gradient_accumulation.steps must be >= 1, got {self.steps}")

    def build_plugin(self) -> Any:
        from accelerate.utils import GradientAccumulationPlugin

        # The loop, not the dataloader's end, decides when to sync: `--steps` counts loop steps.
        return GradientAccumulationPlugin(num_steps=self.steps, sync_with_dataloader=False)


@dataclass
class DdpConfig:
    """torch DistributedDataParallel knobs, used when the run is replicated but not sharded."""

    find_unused_parameters: bool = False
    """Search the autograd graph for parameters that got no gradient (slower; needed by some policies)."""
    bucket_cap_mb: int = 25
    """Gradient all-reduce bucket size."""
    gradient_as_bucket_view: bool = False
    """Let gradients alias the communication buckets (saves memory)."""
    static_graph: bool = False
    """The set of used parameters is the same every step."""

    def build_kwargs(self) -> Any:
        from accelerate.utils import DistributedDataParallelKwargs

        return DistributedDataParallelKwargs(
            find_unused_parameters=self.find_unused_parameters,
            bucket_cap_mb=self.bucket_cap_mb,
            gradient_as_bucket_view=self.gradient_as_bucket_view,
            static_graph=self.static_graph,
        )


@dataclass
class AcceleratorConfig:
    """Precision, accumulation and the data-parallel wrappers' settings."""

    mixed_precision: str = "no"
    """Autocast dtype during training: no, fp16 (with a loss scaler) or bf16 (float16, bfloat16 and
    float32 are accepted as spellings of fp16, bf16 and no)."""
    gradient_accumulation: GradientAccumulationConfig = field(default_factory=GradientAccumulationConfig)
    fsdp: FsdpConfig = field(default_factory=FsdpConfig)
    ddp: DdpConfig = field(default_factory=DdpConfig)
    activation_checkpointing: bool = False
    """Recompute each wrap unit's activations in backward instead of keeping them (the policy's
    `_fsdp_wrap_modules`, or --accelerator.fsdp.wrap_modules / min_num_params): less memory, one more
    forward per unit. Works with or without FSDP; checkpoint keys are unchanged."""
    compile: bool = False
    """torch.compile the wrap units (or the whole policy, --accelerator.compile_scope=model) in place:
    the module tree and so the checkpoint keys stay those of the plain policy (no `_orig_mod.`)."""
    compile_mode: str = "default"
    """torch.compile mode: default, reduce-overhead, max-autotune or max-autotune-no-cudagraphs."""
    compile_scope: str = "units"
    """units (each wrap unit compiled on its own, the FSDP-friendly choice) or model (the whole policy;
    non-sharded runs only)."""
    compile_backend: str = "inductor"
    """torch.compile backend: inductor (needs a C++ compiler on CPU, Triton on GPU), or e.g. aot_eager."""

    def __post_init__(self) -> None:
        from ckpt_tools import dtype_name

        # bfloat16 / float16 mean bf16 / fp16 here too, and fp32 / float32 mean no mixed precision.
        name = dtype_name(self.mixed_precision)
        if name is not None:
            self.mixed_precision = "no" if name == "float32" else _SHORT.get(name, self.mixed_precision)
        if self.mixed_precision not in MIXED_PRECISION:
            raise ConfigError(
                f"--accelerator.mixed_precision={self.mixed_precision!r} is not one of {', '.join(MIXED_PRECISION)}"
            )
        if self.compile_mode not in COMPILE_MODES:
            raise ConfigError(
                f"--accelerator.compile_mode={self.compile_mode!r} is not one of {', '.join(COMPILE_MODES)}"
            )
        if self.compile_scope not in COMPILE_SCOPES:
            raise ConfigError(
                f"--accelerator.compile_scope={self.compile_scope!r} is not one of {', '.join(COMPILE_SCOPES)}"
            )
        mpp = self.fsdp.mixed_precision_policy
        if "float16" in (mpp.param_dtype, mpp.reduce_dtype) and self.mixed_precision != "fp16":
            raise ConfigError(
                "float16 parameters in --accelerator.fsdp.mixed_precision_policy need a loss scaler: "
                "set --accelerator.mixed_precision=fp16"
            )

    def unit_settings(self) -> UnitSettings:
        """What the policy build reads of these settings."""
        return UnitSettings(
            fsdp=self.fsdp,
            mixed_precision=self.mixed_precision,
            activation_checkpointing=self.activation_checkpointing,
            compile=self.compile,
            compile_mode=self.compile_mode,
            compile_scope=self.compile_scope,
            compile_backend=self.compile_backend,
        )


@dataclass(frozen=True)
class UnitSettings:
    """The accelerator settings the policy build applies to the policy's own modules: its FSDP units
    and the modules left out of them, where a sharded policy's shards are materialized (CPU offload),
    the mixed precision the PEFT checks depend on, and the per-unit transforms (checkpointing, compile).
    The accelerate objects (accumulation, DDP, the plugins) are built from the whole `AcceleratorConfig`
    by distributed/factory.py alone."""

    fsdp: FsdpConfig
    mixed_precision: str
    activation_checkpointing: bool
    compile: bool
    compile_mode: str
    compile_scope: str
    compile_backend: str

    @property
    def transforms_units(self) -> bool:
        """Whether activation checkpointing or compile works per wrap unit, so the run needs a wrap
        plan even when it is not sharded."""
        return self.activation_checkpointing or (self.compile and self.compile_scope == "units")
