"""Declared data-parallel layout: plain values, resolved against the world size in distributed/topology.py."""

from __future__ import annotations

from dataclasses import dataclass

from trainer.errors import ConfigError


@dataclass
class ParallelismConfig:
    """How the data-parallel ranks are arranged. `dp_replicate x dp_shard` must equal the world size."""

    dp_replicate: int = 1
    """Replicas of the model (DDP degree, or the outer dimension of HSDP)."""
    dp_shard: int = 1
    """Ranks each replica's parameters are sharded over (FSDP2); -1 fills the rest of the world."""
    cp_size: int = 1
    """Context parallel degree. Reserved: only 1 is supported."""
    tp_size: int = 1
    """Tensor parallel degree. Reserved: only 1 is supported."""

    def __post_init__(self) -> None:
        if self.dp_replicate < 1:
            raise ConfigError(f"--parallelism.dp_replicate must be >= 1, got {self.dp_replicate}")
        if self.dp_shard == 0 or self.dp_shard < -1:
            raise ConfigError(
                f"--parallelism.dp_shard must be >= 1 or -1 (fill the world), got {self.dp_shard}"
            )
        for name in ("cp_size", "tp_size"):
            if getattr(self, name) != 1:
                raise ConfigError(
                    f"--parallelism.{name}={getattr(self, name)} is not supported: context and tensor "
                    f"parallelism are reserved; set --parallelism.{name}=1"
                )
