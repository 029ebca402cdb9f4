"""`--fault_tolerance.*`: per-step fault tolerance across replica groups with torchft (docs/fault_tolerance.md).

Each replica group is one launch (`torchrun` of one or more processes, FSDP2 inside it or one
process); a Lighthouse forms a quorum of the live groups at every step, the gradients are averaged over
those groups only, and a group that (re)starts heals from a live peer. The flag names follow
torchtitan's `--fault_tolerance.*` where it has one. Plain values and their checks: the section the
engine reads is resolved by `resolve_fault_tolerance`, which also reads the Lighthouse address from
`TORCHFT_LIGHTHOUSE` as torchft does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from trainer.errors import ConfigError

LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"
"""The variable torchft's Manager reads the Lighthouse address from when none is passed."""

WORLD_SIZE_MODES = ("dynamic", "fixed_with_spares")
"""torchft's `WorldSizeMode` names: average over every live group, or over `min_replica_size` of them
with the others as spares that contribute zero gradients."""


@dataclass
class FaultToleranceConfig:
    """Per-step fault tolerance across replica groups (torchft); off by default."""

    enable: bool = False
    """Train as one replica group of a fault-tolerant job: a quorum of the live groups at every step
    (needs `pip install 'ckpt-trainer[ft]'` and a Lighthouse: `trainer lighthouse`)."""
    replica_id: int = 0
    """This group's id, 0 .. group_size-1: its share of the data, and the lowest live id saves."""
    group_size: int = 1
    """Replica groups the job is made of (each one launch); the data is split over all of them."""
    min_replica_size: int = 1
    """Fewest live groups a step is applied with; with fewer, nothing of the step is applied and it is
    trained again after the next quorum."""
    lighthouse: str | None = None
    """The Lighthouse's address (http://host:port); unset: the TORCHFT_LIGHTHOUSE environment
    variable, as torchft reads it."""
    quorum_timeout_s: int = 60
    """Seconds a step waits for the quorum (the groups joining) before this group stops with one line."""
    process_group_timeout_ms: int = 10000
    """Milliseconds one gradient exchange across the groups may wait for a peer before it fails and the
    step is trained again after a new quorum; below the quorum timeout, so a group waiting on a dead
    peer through a live one gives up before that live one stops waiting for it in the next quorum."""
    world_size_mode: str = "dynamic"
    """dynamic (average over every live group) or fixed_with_spares (over min_replica_size groups;
    the others are spares contributing zero gradients), torchft's two modes."""

    def __post_init__(self) -> None:
        if not self.enable:
            return
        if self.group_size < 1:
            raise ConfigError(f"--fault_tolerance.group_size must be >= 1, got {self.group_size}")
        if not 0 <= self.replica_id < self.group_size:
            raise ConfigError(
                f"--fault_tolerance.replica_id={self.replica_id} is out of range for "
                f"--fault_tolerance.group_size={self.group_size}: use 0 .. {self.group_size - 1}"
            )
        if not 1 <= self.min_replica_size <= self.group_size:
            raise ConfigError(
                f"--fault_tolerance.min_replica_size={self.min_replica_size} must be between 1 and "
                f"--fault_tolerance.group_size={self.group_size}"
            )
        if self.quorum_timeout_s < 1:
            raise ConfigError(f"--fault_tolerance.quorum_timeout_s must be >= 1, got {self.quorum_timeout_s}")
        if not 1 <= self.process_group_timeout_ms < self.quorum_timeout_s * 1000:
            raise ConfigError(
                f"--fault_tolerance.process_group_timeout_ms={self.process_group_timeout_ms} must be >= 1 and "
                f"below --fault_tolerance.quorum_timeout_s={self.quorum_timeout_s} (in ms): a group stuck in "
                "an exchange with a dead peer must give up before its live peers stop waiting for it"
            )
        if self.world_size_mode not in WORLD_SIZE_MODES:
            raise ConfigError(
                f"--fault_tolerance.world_size_mode={self.world_size_mode!r} is not one of "
                f"{', '.join(WORLD_SIZE_MODES)}"
            )


@dataclass(frozen=True)
class FaultToleranceSection:
    """What the replica-group wiring (distributed/fault_tolerance.py) reads of a fault-tolerant run."""

    replica_id: int
    group_size: int
    min_replica_size: int
    lighthouse: str
    """The Lighthouse address, from the flag or TORCHFT_LIGHTHOUSE."""
    quorum_timeout_s: int
    process_group_timeout_ms: int
    world_size_mode: str
    timeout_s: int
    """How long a heal's transfer or the group's commit vote may take (--collective_timeout_s)."""


def resolve_fault_tolerance(
    config: FaultToleranceConfig, environ: Mapping[str, str], timeout_s: int
) -> FaultToleranceSection | None:
    """The section of a fault-tolerant run (None with --fault_tolerance.enable=false); the Lighthouse
    address from the flag, else from TORCHFT_LIGHTHOUSE. One line when there is none."""
    if not config.enable:
        return None
    lighthouse = config.lighthouse or environ.get(LIGHTHOUSE_ENV, "")
    if not lighthouse:
        raise ConfigError(
            "--fault_tolerance.enable=true needs the Lighthouse's address: set --fault_tolerance.lighthouse="
            f"http://host:port (or {LIGHTHOUSE_ENV}); start one with `trainer lighthouse`"
        )
    return FaultToleranceSection(
        replica_id=config.replica_id,
        group_size=config.group_size,
        min_replica_size=config.min_replica_size,
        lighthouse=lighthouse,
        quorum_timeout_s=config.quorum_timeout_s,
        process_group_timeout_ms=config.process_group_timeout_ms,
        world_size_mode=config.world_size_mode,
        timeout_s=timeout_s,
    )


def check_composition(config: FaultToleranceConfig, dp_replicate: int, evaluator: bool) -> None:
    """What fault tolerance composes with. The replicas are torchft's replica groups (one launch each),
    never a fixed-size mesh dimension inside one launch; the evaluator beside the run is not shared by
    the groups yet."""
    if not config.enable:
        return
    if evaluator:
        raise ConfigError(
            "--env.type with --env_eval_freq > 0 (the evaluator beside the run) and --fault_tolerance.enable=true "
            "is not supported yet: set --env_eval_freq=0 and score the checkpoints with `trainer eval --watch`"
        )
    if dp_replicate > 1:
        raise ConfigError(
            f"--parallelism.dp_replicate={dp_replicate} with --fault_tolerance.enable=true: the replicas are "
            "the replica groups (one launch each, --fault_tolerance.group_size); inside a group use "
            "--parallelism.dp_replicate=1 with --parallelism.dp_shard=-1 (FSDP2) or one process"
        )


def group_dir(output_dir: str, config: FaultToleranceConfig) -> str:
    """Where a replica group keeps what is its own: its run lock and its metrics.jsonl
    (`<output_dir>/replica_<id>`); the checkpoints are the job's, in `output_dir`. Without fault
    tolerance, `output_dir` itself."""
    return f"{output_dir.rstrip('/')}/replica_{config.replica_id}" if config.enable else output_dir
