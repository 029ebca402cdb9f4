"""The `training_step.json` schema: what a resume needs to know about the run that saved.

Reading is strict. An unknown future `format_version`, a missing field, a field of the wrong type or
out of its range (a negative step, zero ranks, an epoch no run reaches) is an error that names the
field, because a resume that guesses silently, or dies later with a traceback, is worse than one that
stops at the start.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ckpt_tools.errors import (
    CorruptCheckpointError,
    ForeignCheckpointError,
    LegacyCheckpointError,
    UnsupportedVersionError,
)
from ckpt_tools.format.untrusted import MAX_INT, describe, parse_json

FORMAT_VERSION = 1


class CheckpointFormat(str, Enum):
    """Which weights a step holds (`checkpoint_format` in training_step.json, `--checkpoint_format`):
    gathered safetensors, sharded DCP, or both. A `str`, so it compares and serializes as its value."""

    SAFETENSORS = "safetensors"
    DCP = "dcp"
    SAFETENSORS_DCP = "safetensors_dcp"

    @property
    def has_safetensors(self) -> bool:
        return self in (CheckpointFormat.SAFETENSORS, CheckpointFormat.SAFETENSORS_DCP)

    @property
    def has_dcp(self) -> bool:
        return self in (CheckpointFormat.DCP, CheckpointFormat.SAFETENSORS_DCP)

    @classmethod
    def names(cls) -> str:
        """The values, as an error message lists them."""
        return ", ".join(member.value for member in cls)


CHECKPOINT_FORMATS = tuple(member.value for member in CheckpointFormat)
MIXED_PRECISION = ("no", "fp16", "bf16")
MAX_RANKS = 1 << 20
MAX_COUNT = 2**31 - 1
"""Upper bound of batch sizes, accumulation steps and epochs: above any run, inside every int32 use."""
MAX_SEED = 2**32 - 1
"""numpy seeds only up to here, and a resume re-seeds numpy."""


@dataclass(frozen=True)
class Topology:
    """Data-parallel layout of the run. Context and tensor parallel degrees are reserved (always 1)."""

    dp_replicate: int = 1
    dp_shard: int = 1
    cp_size: int = 1
    tp_size: int = 1

    @property
    def dp_world_size(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def is_sharded(self) -> bool:
        """Parameters are split across ranks (FSDP2, or HSDP when dp_replicate > 1)."""
        return self.dp_shard > 1

    def describe(self) -> str:
        if self.is_sharded and self.dp_replicate > 1:
            return f"HSDP {self.dp_replicate}x{self.dp_shard}"
        if self.is_sharded:
            return f"FSDP2 {self.dp_shard}"
        if self.dp_replicate > 1:
            return f"DDP {self.dp_replicate}"
        return "single process"


@dataclass(frozen=True)
class SamplerPosition:
    """Where the data order stands: `offset` samples of epoch `epoch`'s global permutation consumed."""

    epoch: int = 0
    offset: int = 0


@dataclass(frozen=True)
class TrainingStep:
    """Contents of `training_state/training_step.json`."""

    step: int
    dp_world_size: int
    batch_size: int
    grad_accum_steps: int
    mixed_precision: str
    topology: Topology
    checkpoint_format: str
    sampler: SamplerPosition = field(default_factory=SamplerPosition)
    seed: int | None = None
    peft: bool = False
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        if self.checkpoint_format not in CHECKPOINT_FORMATS:
            raise CorruptCheckpointError(
                f"training_step.json: checkpoint_format {describe(self.checkpoint_format)} is not one of "
                f"{CheckpointFormat.names()}"
            )
        if self.mixed_precision not in MIXED_PRECISION:
            raise CorruptCheckpointError(
                f"training_step.json: mixed_precision {describe(self.mixed_precision)} is not one of "
                f"{', '.join(MIXED_PRECISION)}"
            )
        for name, value, low, high in (
            ("step", self.step, 0, MAX_INT),
            ("topology.dp_replicate", self.topology.dp_replicate, 1, MAX_RANKS),
            ("topology.dp_shard", self.topology.dp_shard, 1, MAX_RANKS),
            ("topology.cp_size", self.topology.cp_size, 1, MAX_RANKS),
            ("topology.tp_size", self.topology.tp_size, 1, MAX_RANKS),
            ("dp_world_size", self.dp_world_size, 1, MAX_RANKS),
            ("batch_size", self.batch_size, 1, MAX_COUNT),
            ("grad_accum_steps", self.grad_accum_steps, 1, MAX_COUNT),
            ("seed", 0 if self.seed is None else self.seed, 0, MAX_SEED),
            ("sampler.epoch", self.sampler.epoch, 0, MAX_COUNT),
            ("sampler.offset", self.sampler.offset, 0, MAX_INT),
        ):
            _check_range(name, value, low, high)
        if self.topology.dp_world_size != self.dp_world_size:
            raise CorruptCheckpointError(
                f"training_step.json: dp_world_size={self.dp_world_size} but topology "
                f"dp_replicate={self.topology.dp_replicate} x dp_shard={self.topology.dp_shard} "
                f"= {self.topology.dp_world_size}"
            )

    @property
    def global_batch_size(self) -> int:
        """Samples consumed per loop step by the whole run (without accumulation)."""
        return self.batch_size * self.dp_world_size

    @property
    def effective_batch_size(self) -> int:
        """Samples per optimizer update: batch_size x dp_world_size x grad_accum_steps."""
        return self.global_batch_size * self.grad_accum_steps

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, data: Any, source: str = "training_step.json") -> TrainingStep:
        if not isinstance(data, dict):
            raise CorruptCheckpointError(f"{source}: expected a JSON object, got {type(data).__name__}")
        if is_lerobot_step(data):
            lerobot = LeRobotStep.from_dict(data, source)
            raise ForeignCheckpointError(
                f"{source} was written by LeRobot ({lerobot.describe()}): its weights load "
                "(ckpt_tools.load_model_state_dict, ckpt convert) but it cannot be resumed here, its "
                "optimizer and policy are LeRobot's; resume it with lerobot-train"
            )
        if "format_version" not in data:
            raise LegacyCheckpointError(
                f"{source} has no format_version: it was written by an older release and cannot be "
                "resumed; its weights still load (ckpt_tools.load_model_state_dict, or --policy.path)"
            )
        version = _field(data, "format_version", int, source)
        if version > FORMAT_VERSION:
            raise UnsupportedVersionError(
                f"{source}: format_version {version} is newer than this ckpt-tools understands "
                f"({FORMAT_VERSION}); upgrade ckpt-tools"
            )
        if version < 1:
            raise CorruptCheckpointError(f"{source}: format_version must be >= 1, got {version}")
        topo = _field(data, "topology", dict, source)
        sampler = _field(data, "sampler", dict, source)
        return cls(
            format_version=version,
            step=_field(data, "step", int, source),
            dp_world_size=_field(data, "dp_world_size", int, source),
            batch_size=_field(data, "batch_size", int, source),
            grad_accum_steps=_field(data, "grad_accum_steps", int, source),
            mixed_precision=_field(data, "mixed_precision", str, source),
            checkpoint_format=_field(data, "checkpoint_format", str, source),
            seed=_optional_field(data, "seed", int, source),
            peft=bool(_optional_field(data, "peft", bool, source) or False),
            topology=Topology(
                dp_replicate=_field(topo, "dp_replicate", int, f"{source}: topology"),
                dp_shard=_field(topo, "dp_shard", int, f"{source}: topology"),
                cp_size=_optional_field(topo, "cp_size", int, f"{source}: topology") or 1,
                tp_size=_optional_field(topo, "tp_size", int, f"{source}: topology") or 1,
            ),
            sampler=SamplerPosition(
                epoch=_field(sampler, "epoch", int, f"{source}: sampler"),
                offset=_field(sampler, "offset", int, f"{source}: sampler"),
            ),
        )

    @classmethod
    def from_json(cls, text: str | bytes, source: str = "training_step.json") -> TrainingStep:
        data = parse_json(text.encode("utf-8") if isinstance(text, str) else text, source)
        return cls.from_dict(data, source)


def _check_range(name: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise CorruptCheckpointError(
            f"training_step.json: {name} is {describe(value)}, outside {low}..{high}; the file is damaged "
            "or hand-edited, use another checkpoint"
        )


def _field(data: dict[str, Any], name: str, kind: type, source: str) -> Any:
    if name not in data:
        raise CorruptCheckpointError(f"{source}: missing field {name!r}")
    return _check_type(data[name], name, kind, source)


def _optional_field(data: dict[str, Any], name: str, kind: type, source: str) -> Any:
    value = data.get(name)
    return None if value is None else _check_type(value, name, kind, source)


def _check_type(value: Any, name: str, kind: type, source: str) -> Any:
    # bool is an int in Python; a JSON `true` where a count belongs is still a mistake.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise CorruptCheckpointError(
            f"{source}: field {name!r} should be {kind.__name__}, got {type(value).__name__} {describe(value)}"
        )
    return value


LEROBOT_ONLY = ("num_processes", "parallelism")
"""Fields every LeRobot release writes (0.6.x the first, main the second) and no file of ours holds."""
OURS_ONLY = ("topology", "sampler", "mixed_precision", "checkpoint_format")
"""Fields of our `training_step.json` (every version, the pre-v1 ones too) that no LeRobot release writes."""


def is_lerobot_step(data: Any) -> bool:
    """`training_step.json` as a LeRobot release writes it: 0.6.x `{step, num_processes, batch_size}`,
    main `{step, dp_world_size, batch_size, grad_accum_steps, parallelism}`. Neither has
    `format_version`, and neither have our own pre-v1 files: a field only LeRobot writes
    (`LEROBOT_ONLY`) and none only ours hold (`OURS_ONLY`) tells them apart."""
    return (
        isinstance(data, dict)
        and "format_version" not in data
        and any(name in data for name in LEROBOT_ONLY)
        and not any(name in data for name in OURS_ONLY)
    )


@dataclass(frozen=True)
class LeRobotStep:
    """What a LeRobot checkpoint's `training_step.json` says, whichever release wrote it.

    `step` counts LeRobot's loop steps (micro-batches per data-parallel rank), so its sampler stands
    at `step x batch_size x dp_world_size` samples. `parallelism` is LeRobot main's (None before it):
    `dp_replicate`, `dp_shard` and its context-parallel degrees (`ring_degree x ulysses_degree` as
    `cp_size`)."""

    step: int
    dp_world_size: int
    batch_size: int
    grad_accum_steps: int = 1
    parallelism: Topology | None = None

    def __post_init__(self) -> None:
        for name, value, low, high in (
            ("step", self.step, 0, MAX_INT),
            ("dp_world_size", self.dp_world_size, 1, MAX_RANKS),
            ("batch_size", self.batch_size, 1, MAX_COUNT),
            ("grad_accum_steps", self.grad_accum_steps, 1, MAX_COUNT),
        ):
            _check_range(name, value, low, high)
        if self.parallelism is not None and self.parallelism.dp_world_size != self.dp_world_size:
            raise CorruptCheckpointError(
                f"training_step.json: dp_world_size={self.dp_world_size} but parallelism "
                f"dp_replicate={self.parallelism.dp_replicate} x dp_shard={self.parallelism.dp_shard} "
                f"= {self.parallelism.dp_world_size}; the file is damaged or hand-edited"
            )

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "training_step.json") -> LeRobotStep:
        """LeRobot's own reading: `dp_world_size`, or 0.6.x's `num_processes` for it."""
        world = "dp_world_size" if "dp_world_size" in data else "num_processes"
        parallelism = _optional_field(data, "parallelism", dict, source)
        return cls(
            step=_field(data, "step", int, source),
            dp_world_size=_field(data, world, int, source),
            batch_size=_field(data, "batch_size", int, source),
            grad_accum_steps=_optional_field(data, "grad_accum_steps", int, source) or 1,
            parallelism=None if parallelism is None else _lerobot_parallelism(parallelism, source),
        )

    @property
    def sampler(self) -> SamplerPosition:
        """Where LeRobot's data order stands: it resumes its sampler at this many samples of epoch 0
        (no accumulation factor: `step` already counts micro-batches)."""
        return SamplerPosition(0, self.step * self.batch_size * self.dp_world_size)

    def describe(self) -> str:
        """`step 2, dp_world_size 2, parallelism FSDP2 2, batch_size 2` (main), `step 4,
        dp_world_size 1, batch_size 2` (0.6.x); `grad_accum_steps` when above 1."""
        parts = [f"step {self.step}", f"dp_world_size {self.dp_world_size}"]
        if self.parallelism is not None:
            parts.append(f"parallelism {self.parallelism.describe()}")
        parts.append(f"batch_size {self.batch_size}")
        if self.grad_accum_steps > 1:
            parts.append(f"grad_accum_steps {self.grad_accum_steps}")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _lerobot_parallelism(data: dict[str, Any], source: str) -> Topology:
    where = f"{source}: parallelism"
    ring = _optional_field(data, "ring_degree", int, where) or 1
    ulysses = _optional_field(data, "ulysses_degree", int, where) or 1
    topology = Topology(
        dp_replicate=_field(data, "dp_replicate", int, where),
        dp_shard=_field(data, "dp_shard", int, where),
        cp_size=ring * ulysses,
    )
    for name, value in dataclasses.asdict(topology).items():
        _check_range(f"parallelism.{name}", value, 1, MAX_RANKS)
    return topology
