"""One replica group of a fault-tolerant run: torchft's Manager and its process group across groups.

A fault-tolerant job is several replica groups (each one launch: one process, or FSDP2 over the
launch's ranks) and a Lighthouse (`serve_lighthouse`, the `trainer lighthouse` command). At the start
of each step every group asks the Lighthouse for a quorum of the live groups (`ReplicaGroup.start_step`);
after the backward pass each rank averages its gradients with the same rank of every live group over
torchft's reconfigurable gloo process group (`average_gradients`, after the group's own reduction by
FSDP2), and the optimizer steps only when the group's ranks agree the step is sound (`commit`, torchft's
`should_commit`). A run
without `--fault_tolerance.enable` holds `SINGLE_GROUP`, which does none of this, so the loop has one
code path.

torchft is an optional dependency (`pip install 'ckpt-trainer[ft]'`), imported only here and only when
a run or the Lighthouse asks for it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch

from trainer.config.fault_tolerance import FaultToleranceSection
from trainer.errors import ConfigError, RunFailedError

if TYPE_CHECKING:
    from torch.distributed import TCPStore
    from torchft import Manager
    from torchft._torchft import LighthouseServer

INSTALL_HINT = "pip install 'ckpt-trainer[ft]' (torchft)"


def _require_torchft(what: str) -> None:
    """One line naming the extra when torchft is not installed."""
    try:
        import torchft  # noqa: F401
    except ImportError:
        raise ConfigError(f"{what} needs torchft, which is not installed: {INSTALL_HINT}") from None


def serve_lighthouse(
    bind: str, min_replicas: int, join_timeout_ms: int, quorum_tick_ms: int, heartbeat_timeout_ms: int
) -> LighthouseServer:
    """Start torchft's Lighthouse (its Rust server, in this process) on `bind` (host:port; port 0 picks
    a free one). It forms a quorum once `min_replicas` groups joined, or more when they join within
    `join_timeout_ms`, and drops a group whose heartbeats stop for `heartbeat_timeout_ms`."""
    _require_torchft("trainer lighthouse")
    from torchft._torchft import LighthouseServer

    return LighthouseServer(
        bind=bind,
        min_replicas=min_replicas,
        join_timeout_ms=join_timeout_ms,
        quorum_tick_ms=quorum_tick_ms,
        heartbeat_timeout_ms=heartbeat_timeout_ms,
    )


@dataclass(frozen=True)
class Membership:
    """Who took part in a step, as the quorum said: the live groups and this group's rank among them."""

    replicas: int
    replica_rank: int | None
    """None: this group is a spare (fixed_with_spares) or healing, and contributes zero gradients."""


class SingleGroup:
    """A run without fault tolerance: one group, every step committed, nothing exchanged."""

    def start_step(self, step: int) -> Membership | None:
        """No quorum: membership never changes."""
        return None

    def average_gradients(self, model: torch.nn.Module) -> None:
        """The launch's own reduction (DDP, FSDP2) is the whole average."""

    def commit(self, step: int) -> None:
        """Every step is applied."""

    def close(self) -> None:
        """Nothing to shut down."""


SINGLE_GROUP = SingleGroup()


class ReplicaGroup(SingleGroup):
    """This launch as one replica group of a torchft job (its Manager on every rank of the launch)."""

    def __init__(
        self,
        section: FaultToleranceSection,
        group_rank: int,
        group_world: int,
        state_dict: Callable[[], dict[str, Any]],
        load_state_dict: Callable[[dict[str, Any]], None],
    ) -> None:
        _require_torchft("--fault_tolerance.enable=true")
        from torchft import Manager, ProcessGroupGloo
        from torchft.manager import WorldSizeMode

        timeout = timedelta(seconds=section.timeout_s)
        self._section = section
        self._store, store_addr, store_port = _group_store(group_world)
        self._manager: Manager = Manager(
            pg=ProcessGroupGloo(timeout=timeout),
            load_state_dict=load_state_dict,
            state_dict=state_dict,
            min_replica_size=section.min_replica_size,
            use_async_quorum=False,  # a healing group loads its peer's state before its forward pass
            timeout=timeout,
            quorum_timeout=timedelta(seconds=section.quorum_timeout_s),
            connect_timeout=timeout,
            rank=group_rank,
            world_size=group_world,
            world_size_mode=WorldSizeMode[section.world_size_mode.upper()],
            store_addr=store_addr,
            store_port=store_port,
            lighthouse_addr=section.lighthouse,
            replica_id=f"replica_{section.replica_id}",
            init_sync=False,  # every group initializes the same weights from --seed
        )
        self._membership: Membership | None = None

    def start_step(self, step: int) -> Membership | None:
        """Collective over the group. The quorum of this step (healing from a peer first, when this
        group is behind); returns the membership when it changed since the last step, else None."""
        self._manager.start_quorum(timeout=timedelta(seconds=self._section.quorum_timeout_s))
        membership = Membership(self._manager.num_participants(), self._manager.participating_rank())
        if membership.replicas > self._section.group_size:
            raise RunFailedError(
                f"the quorum at step {step} holds {membership.replicas} replica groups, more than "
                f"--fault_tolerance.group_size={self._section.group_size}: give every group the same "
                "--fault_tolerance.group_size (the groups of the job) and a distinct --fault_tolerance.replica_id"
            )
        changed = membership != self._membership
        self._membership = membership
        return membership if changed else None

    def average_gradients(self, model: torch.nn.Module) -> None:
        """Collective across the live groups: each gradient (this rank's shard of it under FSDP2)
        averaged with the same rank of every other group; a failed exchange marks the step, which
        `should_commit` then refuses."""
        works = [
            self._manager.allreduce(_local(param.grad))
            for param in model.parameters()
            if param.grad is not None
        ]
        for work in works:
            work.wait()

    def commit(self, step: int) -> None:
        """Collective over the group, before the optimizer steps: torchft's `should_commit` (enough
        live groups, no failed exchange on any rank of the group). A step not committed is never
        applied: the run stops with one line (retrying it is not built yet)."""
        if self._manager.should_commit():
            return
        raise RunFailedError(
            f"step {step} was not committed by the replica groups (fewer than "
            f"--fault_tolerance.min_replica_size={self._section.min_replica_size} live, or a peer failed "
            "during the gradient exchange): nothing of it was applied; relaunch this group"
        )

    def close(self) -> None:
        """Stop the Manager (its server on the group's rank 0) and its checkpoint server."""
        self._manager.shutdown(wait=False)


def _local(grad: torch.Tensor) -> torch.Tensor:
    """This rank's part of a gradient: the local shard of an FSDP2 DTensor, else the tensor itself."""
    return grad.to_local() if hasattr(grad, "to_local") else grad


def _group_store(group_world: int) -> tuple[TCPStore | None, str | None, int | None]:
    """The TCPStore the group's Manager meets on: torchrun's (MASTER_ADDR/MASTER_PORT, passed as
    None so torchft reads them), or one this process hosts when it is a group of its own without a
    launcher. Returns the store to keep alive and its address."""
    if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
        return None, None, None
    if group_world != 1:
        raise ConfigError(
            "a replica group of several processes is launched by torchrun (MASTER_ADDR is unset)"
        )
    from torch.distributed import TCPStore

    store = TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    return store, "localhost", store.port


def data_split(section: FaultToleranceSection | None, dp_world_size: int, dp_rank: int) -> tuple[int, int]:
    """The data-parallel world and rank the sampler splits the global order by: every rank of every
    replica group is one slice (group r's ranks after those of groups 0 .. r-1), so G groups of W ranks
    read what one launch of G x W ranks would (torchft's sampler semantics, by replica id)."""
    if section is None:
        return dp_world_size, dp_rank
    return dp_world_size * section.group_size, section.replica_id * dp_world_size + dp_rank


def join_replica_group(
    section: FaultToleranceSection | None, group_rank: int, group_world: int, model: torch.nn.Module
) -> SingleGroup:
    """Collective over the launch. This launch's replica group (`SINGLE_GROUP` without fault
    tolerance). Healing from a peer is not built yet: a group that would have to is stopped with one
    line when the peer's state arrives, before it trains on stale weights."""
    if section is None:
        return SINGLE_GROUP

    def state_dict() -> dict[str, Any]:
        return {"model": model.state_dict()}

    def load_state_dict(state: dict[str, Any]) -> None:
        raise RunFailedError(
            f"replica group {section.replica_id} is behind its live peers and healing from them is not built "
            "yet: stop every group and relaunch the job with --resume=true"
        )

    return ReplicaGroup(section, group_rank, group_world, state_dict, load_state_dict)
