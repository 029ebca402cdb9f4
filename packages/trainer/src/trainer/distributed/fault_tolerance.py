"""One replica group of a fault-tolerant run: torchft's Manager and its process group across groups.

A fault-tolerant job is several replica groups (each one launch: one process, or FSDP2 over the
launch's ranks) and a Lighthouse (`serve_lighthouse`, the `trainer lighthouse` command). At the start
of each optimizer step (each accumulation window) every group asks the Lighthouse for a quorum of the
live groups (`ReplicaGroup.start_step`); each rank averages the window's gradients with the same rank
of every live group over torchft's reconfigurable gloo process group, during the window's last backward
pass in a group of one process (`exchange_during_backward`), after it under FSDP2, which reduces inside
the group first (`average_gradients`), and the optimizer steps only when the group's ranks agree the
step is sound (`commit`, torchft's `should_commit`). A run without `--fault_tolerance.enable` holds
`SINGLE_GROUP`, which does none of this (and registers no hook), so the loop has one code path.

torchft is an optional dependency (`pip install 'ckpt-trainer[ft]'`), imported only here and only when
a run or the Lighthouse asks for it.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from trainer.config.fault_tolerance import FaultToleranceSection
from trainer.distributed.gradient_buckets import (
    OVERLAPPED_BUCKET_BYTES,
    Allreduce,
    OverlappedExchange,
    exchange_after_backward,
)
from trainer.distributed.heal_state import GroupState, local_part
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
class Quorum:
    """A step's quorum as this group sees it."""

    step: int
    replicas: int
    """The live groups taking part."""
    replica_rank: int | None
    """This group's rank among them (0: the lowest live replica id, the one that saves); None: a spare
    (fixed_with_spares), contributing zero gradients."""
    changed: bool
    """The membership differs from the previous step's (a metrics.jsonl record)."""
    trained: bool
    """The live peers have trained this step already: this group healed from them and skips it."""
    weights_sha256: str = ""
    """On a membership change: the digest of the group's weights (every rank's shard of the model and
    the EMA) as the step starts (a group that healed holds its peer's, bit for bit, so both groups record the same)."""
    optimizer_sha256: str = ""
    """The same of the optimizer's state (moments, step counters), on a membership change."""

    def line(self) -> str:
        return f"step {self.step}: quorum of {self.replicas} replica groups"

    def record(self) -> dict[str, Any]:
        """The membership change as a metrics.jsonl record, with the time it was formed (how long a
        group was away is the time between two of them)."""
        return {
            "event": "quorum",
            "step": self.step,
            "replicas": self.replicas,
            "replica_rank": self.replica_rank,
            "weights_sha256": self.weights_sha256,
            "optimizer_sha256": self.optimizer_sha256,
            "time": time.time(),
        }


class SingleGroup:
    """A run without fault tolerance: one group, every step committed, nothing exchanged."""

    saves = True
    """Whether this group writes the checkpoints (the lowest live replica id)."""
    may_retry = False
    """Whether a window can go uncommitted and be trained again (the loop then keeps its batches)."""

    def join(self, start_step: int) -> int:
        """The step the loop starts after: where the run resumed."""
        return start_step

    def start_step(self, step: int) -> Quorum:
        """No quorum for the window starting at loop step `step`: the membership never changes."""
        return Quorum(step, 1, 0, changed=False, trained=False)

    def exchange_during_backward(self) -> None:
        """Before the backward pass that ends a window: nothing is exchanged across groups."""

    def average_gradients(self, model: torch.nn.Module) -> None:
        """The launch's own reduction (DDP, FSDP2) is the whole average."""

    def commit(self, step: int) -> bool:
        """Every step is applied."""
        return True

    def finish(self, step: int) -> dict[str, Any] | None:
        """At the end of the run: nothing to shut down, nothing to report."""
        return None


SINGLE_GROUP = SingleGroup()


class ReplicaGroup(SingleGroup):
    """This launch as one replica group of a torchft job (its Manager on every rank of the launch)."""

    may_retry = True

    def __init__(
        self,
        section: FaultToleranceSection,
        group_rank: int,
        group_world: int,
        state: GroupState,
        window: int,
    ) -> None:
        _require_torchft("--fault_tolerance.enable=true")
        from torchft import Manager, ProcessGroupGloo
        from torchft.manager import WorldSizeMode

        timeout = timedelta(seconds=section.timeout_s)
        self._section, self._state = section, state
        self._window = window  # loop steps per optimizer update: torchft's Manager counts updates
        self._store, store_addr, store_port = _group_store(group_world)
        self._manager: Manager = Manager(
            # an exchange with a dead peer fails within this, before the live peers' quorum gives up
            pg=ProcessGroupGloo(timeout=timedelta(milliseconds=section.process_group_timeout_ms)),
            load_state_dict=state.load_state_dict,
            state_dict=state.state_dict,
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
            # the quorum ranks groups by this id as a string: zero-padded, rank 0 is the lowest id
            replica_id=f"replica_{section.replica_id:06d}",
            init_sync=False,  # every group initializes the same weights from --seed
        )
        self._overlapped = _overlapped_exchange(state.model, group_world, self._manager.allreduce)
        self._members: tuple[int, int | None] | None = None
        self._joined: Quorum | None = None
        self.saves = False

    def join(self, start_step: int) -> int:
        """Collective over the group, before the loop. This group's first quorum, at `start_step`
        (where it resumed, the end of a window): when live peers are further on, it heals from one of
        them (model, optimizer, schedule, EMA, sampler, RNG) and the loop starts after their step. The
        quorum serves the loop's first window, which the live groups take together with this one."""
        if start_step % self._window:
            raise ConfigError(
                f"resumed at step {start_step}, inside a window of --accelerator.gradient_accumulation.steps="
                f"{self._window}: under fault tolerance resume with the accumulation the run saved with"
            )
        self._manager.load_state_dict({"step": start_step // self._window, "batches_committed": 0})
        self._joined = self._quorum(start_step + 1, joining=True)
        return self._manager.current_step() * self._window

    def start_step(self, step: int) -> Quorum:
        """Collective over the group. The quorum of the window starting at loop step `step` (the one
        taken at `join` for the first window), healing first when this group is behind its live peers."""
        joined, self._joined = self._joined, None
        return joined if joined is not None else self._quorum(step)

    def _quorum(self, step: int, joining: bool = False) -> Quorum:
        """The quorum of the window starting at loop step `step`; a group behind its peers heals first.
        Only a joining group may heal past more than this window: the loop has not started its data
        feed yet."""
        timeout = self._section.quorum_timeout_s
        try:
            self._manager.start_quorum(timeout=timedelta(seconds=timeout))
        except (RuntimeError, TimeoutError) as exc:
            raise RunFailedError(
                f"no quorum for step {step} within --fault_tolerance.quorum_timeout_s={timeout} (is the "
                f"Lighthouse {self._section.lighthouse} up, with --min_replicas groups alive?): "
                f"{' '.join(str(exc).split())[:160]}"
            ) from None
        members = (self._manager.num_participants(), self._manager.participating_rank())
        if members[0] > self._section.group_size:
            raise RunFailedError(
                f"the quorum at step {step} holds {members[0]} replica groups, more than "
                f"--fault_tolerance.group_size={self._section.group_size}: give every group the same "
                "--fault_tolerance.group_size (the groups of the job) and a distinct --fault_tolerance.replica_id"
            )
        done, last = self._manager.current_step() * self._window, step + self._window - 1
        if done > last and not joining:
            raise RunFailedError(
                f"replica group {self._section.replica_id} healed to step {done} while at step {step}: "
                "its data feed cannot skip ahead mid-run; relaunch it with --resume=true"
            )
        changed, self._members = members != self._members, members
        self.saves = members[1] == 0
        return Quorum(
            done + 1 if joining else step,  # a joining group's loop starts after the step it healed to
            *members,
            changed=changed,
            trained=done == last and not joining,
            weights_sha256=group_digest(self._state.weights()) if changed else "",
            optimizer_sha256=group_digest(self._state.optimizer_tensors()) if changed else "",
        )

    def exchange_during_backward(self) -> None:
        """Before the backward pass that ends a window: in a group of one process, each bucket of
        gradients is sent across the groups as soon as the backward pass has produced it, as DDP does
        (`average_gradients` then waits for them)."""
        if self._overlapped is not None:
            self._overlapped.arm()

    def average_gradients(self, model: torch.nn.Module) -> None:
        """Collective across the live groups, after the window's last backward pass: the gradients
        (this rank's shards of them under FSDP2) averaged with the same rank of every other group, in
        a few flat buckets (distributed/gradient_buckets.py). In a group of one process they were sent
        during the backward pass: any bucket still waiting is sent now, then all are waited for; under FSDP2
        they are sent now, after the group's own reduce-scatter. A failed exchange marks the step,
        which `commit` then refuses."""
        if self._overlapped is not None:
            self._overlapped.finish()
            return
        grads = [local_part(param.grad) for param in model.parameters() if param.grad is not None]
        exchange_after_backward(grads, self._manager.allreduce)

    def commit(self, step: int) -> bool:
        """Collective over the group, before the optimizer steps: torchft's `should_commit` (enough
        live groups, no failed exchange on any rank of the group). A step not committed is never
        applied; the loop trains it again after a new quorum."""
        return bool(self._manager.should_commit())

    def finish(self, step: int) -> dict[str, Any] | None:
        """Collective over the group. Stop the Manager (its server on the group's rank 0) and its
        checkpoint server. Returns the group's last record for metrics.jsonl: the step it finished at
        and a digest of its weights (every rank's shard, the EMA's too), which equals every other
        group's when they trained in step."""
        self._manager.shutdown(wait=False)
        return {
            "event": "replica_finished",
            "step": step,
            "replica_id": self._section.replica_id,
            "weights_sha256": group_digest(self._state.weights()),
        }


def group_digest(tensors: list[torch.Tensor]) -> str:
    """Collective over the group. The sha256 of each rank's `tensors` (its parts), bit for bit, gathered
    over the group's ranks in rank order and hashed again: equal in two groups exactly when every rank
    holds what the same rank of the other holds."""
    digest = hashlib.sha256()
    for tensor in tensors:
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    ranks = [digest.hexdigest()]
    if dist.is_initialized() and dist.get_world_size() > 1:
        ranks = [""] * dist.get_world_size()
        dist.all_gather_object(ranks, digest.hexdigest())
    return hashlib.sha256("".join(ranks).encode()).hexdigest()


def _overlapped_exchange(
    model: torch.nn.Module, group_world: int, allreduce: Allreduce
) -> OverlappedExchange | None:
    """The exchange overlapped with the backward pass where a gradient is final once the backward
    pass accumulated it: a group of one process holding whole tensors. Under FSDP2 (DTensor
    parameters) a rank's gradient shard is final only after the group's reduce-scatter, and with
    several unsharded processes only after their all-reduce: those groups exchange after the backward
    pass (None)."""
    if group_world > 1 or any(isinstance(param, DTensor) for param in model.parameters()):
        return None
    return OverlappedExchange(model, allreduce, OVERLAPPED_BUCKET_BYTES)


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
    section: FaultToleranceSection | None, group_rank: int, group_world: int, state: GroupState, window: int
) -> SingleGroup:
    """This launch's replica group (`SINGLE_GROUP` without fault tolerance); `state` is what a healing
    peer fetches from it, and what it takes over when it heals; `window` the loop steps per optimizer
    update (--accelerator.gradient_accumulation.steps), the steps each quorum serves."""
    if section is None:
        return SINGLE_GROUP
    return ReplicaGroup(section, group_rank, group_world, state, window)
