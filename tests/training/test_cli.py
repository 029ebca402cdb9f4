"""`trainer` as a user types it: help, version, and the one-line answers to mistyped flags."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.cli import main
from trainer.cli.parse import parse_config
from trainer.errors import ConfigError

TRAINER = Path(sys.executable).with_name("trainer")


def test_top_level_help_and_version_exit_0_on_stdout() -> None:
    for args, expected in ((["--help"], "usage: trainer train"), (["--version"], "trainer 0.")):
        result = subprocess.run([TRAINER, *args], capture_output=True, text=True, timeout=60)
        assert (result.returncode, result.stderr) == (0, ""), result
        assert result.stdout.startswith(expected)
    assert subprocess.run([TRAINER], capture_output=True, text=True, timeout=60).returncode == 2
    ckpt = subprocess.run(
        [TRAINER.with_name("ckpt"), "--version"], capture_output=True, text=True, timeout=60
    )
    assert (ckpt.returncode, ckpt.stdout, ckpt.stderr) == (0, "ckpt 0.1.0\n", "")


def _help(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    with pytest.raises(SystemExit) as info:
        main(["train", *args])
    assert info.value.code == 0
    return capsys.readouterr().out


def test_help_for_one_policy_type_lists_that_type_only(capsys) -> None:
    every = _help(capsys, "--help")
    assert "--policy.hidden_dim=128" in every and "--policy.dim=" in every  # mlp and act fields
    mlp = _help(capsys, "--policy.type=mlp", "--steps=3", "-h")
    assert "--policy.type=mlp" in mlp and "--policy.hidden_dim=128" in mlp and "--policy.blocks=2" in mlp
    assert "--policy.dim=" not in mlp and "(act)" not in mlp
    names = [line.split("=")[0].strip() for line in mlp.splitlines() if line.startswith("  --")]
    assert len(names) == len(set(names))  # no duplicates
    assert _help(capsys, "--policy.type", "mlp", "--help") == mlp  # `--flag value` is the same flag


def test_help_for_an_unknown_policy_type_is_one_line(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["train", "--policy.type=nope", "--help"])
    assert info.value.code == 1
    assert capsys.readouterr().err.strip().startswith("error: --policy.type='nope' is unknown")


@pytest.mark.parametrize(
    ("flag", "meant"),
    [
        ("--parallelism.dp-shard=2", "--parallelism.dp_shard"),
        ("--batchsize=4", "--batch_size"),
        ("--accelerator.fsdp.min-num-params=10", "--accelerator.fsdp.min_num_params"),
    ],
)
def test_unknown_flag_suggests_the_closest_one(flag: str, meant: str) -> None:
    with pytest.raises(ConfigError, match=rf"unrecognized arguments: {flag}.*; did you mean {meant}\?$"):
        parse_config([flag])
    with pytest.raises(ConfigError) as info:
        parse_config(["--zzzz=1"])
    assert "did you mean" not in str(info.value)


@pytest.mark.parametrize(("short", "name"), [("bf16", "bfloat16"), ("fp16", "float16"), ("fp32", "float32")])
def test_both_dtype_spellings_are_accepted(short: str, name: str) -> None:
    for spelling in (short, name, name.upper()):
        config = parse_config(
            [
                f"--policy.dtype={spelling}",
                f"--accelerator.fsdp.mixed_precision_policy.param_dtype={spelling}",
                "--accelerator.mixed_precision=fp16",
            ]
        )
        assert config.policy.dtype == name
        assert config.accelerator.fsdp.mixed_precision_policy.param_dtype == name
    precision = {"bfloat16": "bf16", "float16": "fp16", "float32": "no"}[name]
    assert parse_config([f"--accelerator.mixed_precision={name}"]).accelerator.mixed_precision == precision
    with pytest.raises(ConfigError, match=r"--policy.dtype='fp8' is not one of float32 \(fp32\), bfloat16"):
        parse_config(["--policy.dtype=fp8"])


def test_a_rank_whose_peers_never_join_fails_in_one_line_within_the_timeout(tmp_path) -> None:
    """Rank 0 of a two-rank launch whose rank 1 never starts: the rendezvous times out before the process
    group exists, and that is one line naming the flag that bounds it, exit 1, nothing written."""
    from helpers.launch import free_port

    env = {
        **os.environ,
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "2",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    out = tmp_path / "run"
    args = [
        "train",
        f"--output_dir={out}",
        "--collective_timeout_s=2",
        "--steps=2",
        "--parallelism.dp_shard=1",
    ]
    result = subprocess.run([TRAINER, *args], capture_output=True, text=True, timeout=120, env=env)
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert lines == [lines[0]] and lines[0].startswith(
        "error: rank 0: the ranks did not all join the process group within --collective_timeout_s=2 ("
    ), result.stderr
    assert not (out / "checkpoints").exists()
