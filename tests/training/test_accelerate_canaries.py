"""Canaries: the accelerate internals the CPU adapters (distributed/factory.py) rely on.

If an accelerate upgrade changes one of these, this file fails first and names what moved; then
revisit `_engage_fsdp_on_cpu` / `_engage_fp16_on_cpu` (and drop them if accelerate engages FSDP or fp16
on CPU by itself).
"""

from __future__ import annotations

import inspect

import accelerate
from accelerate import Accelerator
from accelerate.parallelism_config import ParallelismConfig
from accelerate.state import AcceleratorState, PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin, fsdp_utils


def test_accelerate_version_is_the_one_the_adapter_was_written_for() -> None:
    major, minor = (int(x) for x in accelerate.__version__.split(".")[:2])
    assert (major, minor) >= (1, 10)


def test_cpu_launch_is_distributed_only_with_cpu_true() -> None:
    source = inspect.getsource(PartialState._prepare_backend)
    assert "distributed_type = DistributedType.MULTI_CPU" in source
    assert "and cpu" in source


def test_fsdp_is_engaged_only_for_accelerator_device_types() -> None:
    """Why the adapter exists: AcceleratorState sets FSDP inside the GPU-like branch only."""
    source = inspect.getsource(AcceleratorState.__init__)
    branch = source.index("DistributedType.MULTI_GPU,")
    assert source.index("self.distributed_type = DistributedType.FSDP") > branch
    assert "DistributedType.MULTI_CPU," not in source[branch : source.index("DistributedType.FSDP", branch)]


def test_accelerator_state_copies_partial_state_on_every_instantiation() -> None:
    """Why the adapter sets distributed_type in PartialState's shared dict too."""
    source = inspect.getsource(AcceleratorState.__init__)
    assert "self.__dict__.update(PartialState._shared_state)" in source
    assert 'PartialState._shared_state["distributed_type"] = self.distributed_type' in source


def test_accelerator_reads_fsdp_settings_from_its_state() -> None:
    assert "self.state.is_fsdp2" in inspect.getsource(Accelerator.is_fsdp2.fget)
    assert "self.state.device_mesh" in inspect.getsource(Accelerator.torch_device_mesh.fget)
    assert "self.state.parallelism_config" in inspect.getsource(Accelerator.parallelism_config.fget)
    assert "self._prepare_fsdp2" in inspect.getsource(Accelerator.prepare)
    is_fsdp2 = inspect.getsource(AcceleratorState.is_fsdp2.fget)
    assert "self.distributed_type == DistributedType.FSDP" in is_fsdp2
    assert "self.fsdp_plugin.fsdp_version == 2" in is_fsdp2


def test_fsdp2_prepare_model_uses_the_state_mesh_and_plugin() -> None:
    source = inspect.getsource(fsdp_utils.fsdp2_prepare_model)
    assert "accelerator.state.fsdp_plugin" in source
    assert 'getattr(accelerator, "torch_device_mesh", None)' in source
    assert "accelerator.parallelism_config.fsdp_dim_names" in source
    assert "fully_shard(module, **fsdp2_kwargs)" in source


def test_parallelism_config_builds_a_cpu_mesh_with_hsdp_dims() -> None:
    config = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2)
    assert config.fsdp_dim_names == ["dp_replicate", "dp_shard_cp"]
    assert callable(config.build_device_mesh)


def test_plugin_takes_fsdp2_fields_and_sets_mixed_precision() -> None:
    fields = inspect.signature(FullyShardedDataParallelPlugin).parameters
    for name in (
        "fsdp_version",
        "auto_wrap_policy",
        "transformer_cls_names_to_wrap",
        "min_num_params",
        "reshard_after_forward",
        "cpu_offload",
        "ignored_modules",
        "mixed_precision_policy",
    ):
        assert name in fields, name
    assert (
        "buffer_autocast" in inspect.signature(FullyShardedDataParallelPlugin.set_mixed_precision).parameters
    )
    assert DistributedType.FSDP.value == "FSDP"


def test_accelerator_init_exports_use_fsdp() -> None:
    """Why the factory builds the Accelerator inside `_no_leaked_env`."""
    assert 'os.environ["ACCELERATE_USE_FSDP"] = "true"' in inspect.getsource(Accelerator.__init__)


def test_fp16_is_engaged_only_off_cpu_through_two_attributes() -> None:
    """Why the CPU fp16 adapter exists (accelerate's fp16 branch skips CPU devices), and that setting
    `native_amp` and `scaler` before prepare() is all that branch does for the training path."""
    init = inspect.getsource(Accelerator.__init__)
    branch = init.index('self.state.mixed_precision == "fp16"')
    assert 'and self.device.type != "cpu"' in init[branch : branch + 120]
    assert "self.native_amp = True" in init[branch:] and "self.scaler = get_grad_scaler(" in init[branch:]
    assert "if self.native_amp:" in inspect.getsource(Accelerator.prepare_model)  # forward in autocast
    # the optimizer wraps the scaler set before prepare(): `scaler=self.scaler` (accelerate >= 1.16), or
    # through a local that is None only for the MSAMP fp8 backend (earlier releases)
    optimizer = inspect.getsource(Accelerator.prepare_optimizer)
    assert "scaler=self.scaler)" in optimizer or (
        "scaler = None if self.fp8_backend == FP8BackendType.MSAMP else self.scaler" in optimizer
    )
    assert "self.scaler.scale(loss).backward(" in inspect.getsource(Accelerator.backward)
    unscale = inspect.getsource(Accelerator.unscale_gradients)
    assert 'if self.native_amp and self.mixed_precision == "fp16":' in unscale
    assert "self.scaler.unscale_(opt)" in unscale
