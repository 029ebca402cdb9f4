"""`--fault_tolerance.*`: off by default, and every bad setting is one line naming its flag, refused
before anything is built (docs/fault_tolerance.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trainer.cli.parse import parse_config
from trainer.config.fault_tolerance import LIGHTHOUSE_ENV, resolve_fault_tolerance
from trainer.engine.plan import resolve_plan
from trainer.errors import ConfigError

TRAINER = Path(sys.executable).with_name("trainer")
ENABLED = ("--fault_tolerance.enable=true", "--fault_tolerance.group_size=2")
LIGHTHOUSE = "--fault_tolerance.lighthouse=http://localhost:29510"


def test_off_by_default_and_recorded_in_the_config() -> None:
    config = parse_config([])
    assert config.fault_tolerance.enable is False
    assert resolve_fault_tolerance(config.fault_tolerance, {LIGHTHOUSE_ENV: "http://x:1"}, 300) is None


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (("--fault_tolerance.replica_id=2",), "--fault_tolerance.replica_id=2 is out of range"),
        (("--fault_tolerance.replica_id=-1",), "--fault_tolerance.replica_id=-1 is out of range"),
        (("--fault_tolerance.min_replica_size=3",), "--fault_tolerance.min_replica_size=3 must be between"),
        (("--fault_tolerance.group_size=0",), "--fault_tolerance.group_size must be >= 1"),
        (("--fault_tolerance.quorum_timeout_s=0",), "--fault_tolerance.quorum_timeout_s must be >= 1"),
        (
            ("--fault_tolerance.process_group_timeout_ms=60000",),
            "--fault_tolerance.process_group_timeout_ms=60000 must be >= 1 and below "
            "--fault_tolerance.quorum_timeout_s=60",
        ),
        (("--fault_tolerance.world_size_mode=elastic",), "--fault_tolerance.world_size_mode='elastic'"),
    ],
)
def test_bad_values_are_one_line_naming_the_flag(flags: tuple[str, ...], named: str) -> None:
    with pytest.raises(ConfigError, match="^" + named.replace("(", r"\(")) as raised:
        parse_config([*ENABLED, LIGHTHOUSE, *flags])
    assert "\n" not in str(raised.value)


def test_the_lighthouse_address_comes_from_the_flag_or_torchft_s_variable() -> None:
    config = parse_config([*ENABLED, "--fault_tolerance.replica_id=1"]).fault_tolerance
    with pytest.raises(
        ConfigError, match=r"needs the Lighthouse's address: set --fault_tolerance.lighthouse="
    ):
        resolve_fault_tolerance(config, {}, 300)
    section = resolve_fault_tolerance(config, {LIGHTHOUSE_ENV: "http://lh:29510"}, 300)
    assert section is not None
    assert (section.lighthouse, section.replica_id, section.group_size, section.timeout_s) == (
        "http://lh:29510",
        1,
        2,
        300,
    )
    flagged = parse_config([*ENABLED, LIGHTHOUSE]).fault_tolerance
    section = resolve_fault_tolerance(flagged, {LIGHTHOUSE_ENV: "http://lh:29510"}, 300)
    assert section is not None and section.lighthouse == "http://localhost:29510"  # the flag wins


@pytest.mark.parametrize(
    ("flags", "world", "named"),
    [
        (
            ("--parallelism.dp_replicate=2", "--parallelism.dp_shard=1"),
            2,
            "--parallelism.dp_replicate=2 with",
        ),
        ((), 2, "--parallelism.dp_replicate=2 with"),  # a launch's default DDP is a replicate dimension too
    ],
)
def test_the_plan_refuses_what_fault_tolerance_does_not_compose_with(
    flags: tuple[str, ...], world: int, named: str
) -> None:
    config = parse_config([*ENABLED, LIGHTHOUSE, "--policy.type=mlp", *flags])
    with pytest.raises(ConfigError, match="^" + named):
        resolve_plan(config, world)


def test_gradient_accumulation_composes_with_fault_tolerance() -> None:
    """A quorum per accumulation window (tests/distributed/test_fault_tolerance_fsdp.py trains it)."""
    flags = ("--accelerator.gradient_accumulation.steps=2", "--steps=4", "--parallelism.dp_shard=2")
    plan, _ = resolve_plan(parse_config([*ENABLED, LIGHTHOUSE, "--policy.type=mlp", *flags]), 2)
    assert plan.loop.grad_accum_steps == 2 and plan.fault_tolerance is not None


def test_the_plan_refuses_a_missing_lighthouse(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LIGHTHOUSE_ENV, raising=False)
    with pytest.raises(ConfigError, match=r"^--fault_tolerance.enable=true needs the Lighthouse's address"):
        resolve_plan(parse_config([*ENABLED, "--policy.type=mlp"]), 1)


def test_the_cli_says_one_line_and_exits_1(tmp_path: Path) -> None:
    env = {"PATH": str(TRAINER.parent), "PYTHONPATH": ":".join(sys.path)}
    result = subprocess.run(
        [TRAINER, "train", *ENABLED, "--fault_tolerance.replica_id=5", f"--output_dir={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "error: --fault_tolerance.replica_id=5 is out of range for --fault_tolerance.group_size=2: use 0 .. 1"
    ]
    assert not list(tmp_path.iterdir())  # nothing written
