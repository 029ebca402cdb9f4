"""Resolve the declared parallelism against the launch: a frozen `ckpt_tools.training.Topology`.

The resolved topology is the one object the engine asks about the layout (dp_world_size, is_sharded
are defined once, on `Topology`), and it is what training_step.json records.
"""

from __future__ import annotations

import os

from ckpt_tools.training import Topology
from trainer.config.parallelism import ParallelismConfig
from trainer.errors import ConfigError


def launch_world_size() -> int:
    """Processes in this launch, as torchrun / accelerate launch announce it."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def resolve_topology(parallelism: ParallelismConfig, world_size: int) -> Topology:
    """`dp_shard=-1` fills the world; no flags on a multi-process launch means DDP over every rank."""
    replicate, shard = parallelism.dp_replicate, parallelism.dp_shard
    if shard == -1:
        if world_size % replicate:
            raise ConfigError(
                f"--parallelism.dp_shard=-1 cannot fill the world: world size {world_size} is not divisible "
                f"by --parallelism.dp_replicate={replicate}"
            )
        shard = world_size // replicate
    elif (replicate, shard) == (1, 1):
        replicate = world_size
    if replicate * shard * parallelism.cp_size * parallelism.tp_size != world_size:
        raise ConfigError(
            f"--parallelism.dp_replicate={replicate} x --parallelism.dp_shard={shard} x "
            f"--parallelism.cp_size={parallelism.cp_size} x --parallelism.tp_size={parallelism.tp_size} = "
            f"{replicate * shard * parallelism.cp_size * parallelism.tp_size}, but the launch has "
            f"{world_size} processes: make the product equal the world size (or use dp_shard=-1)"
        )
    return Topology(
        dp_replicate=replicate, dp_shard=shard, cp_size=parallelism.cp_size, tp_size=parallelism.tp_size
    )


def check_checkpoint_format(checkpoint_format: str, topology: Topology) -> None:
    """DCP weights need sharded parameters; a non-sharded run writes plain safetensors."""
    if checkpoint_format != "safetensors" and not topology.is_sharded:
        raise ConfigError(
            f"--checkpoint_format={checkpoint_format} needs a sharded run ({topology.describe()} is not): "
            "use --checkpoint_format=safetensors or set --parallelism.dp_shard > 1"
        )
