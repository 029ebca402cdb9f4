"""Every validation error is raised at start, in one line that names the flag and the fix."""

from __future__ import annotations

import dataclasses
import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import nn

import helpers.toy_policy  # noqa: F401  (registers --policy.type=toy: the tables below must not list it)
from trainer.cli.flags import all_flags, help_text, markdown_table
from trainer.cli.parse import parse_config
from trainer.config.environment import EnvConfig
from trainer.config.optim import OptimizerConfig, SchedulerConfig
from trainer.config.parallelism import ParallelismConfig
from trainer.config.train import encode_config
from trainer.data.pipeline.augment import ImageTransformsConfig
from trainer.data.sources.mixture import MixtureConfig
from trainer.distributed.factory import ALLOW_ENV, _quiet_mesh_slicing_warning, check_accelerate_env
from trainer.distributed.topology import check_checkpoint_format, resolve_topology
from trainer.distributed.wrap import WrapPlan, check_tied_weights, resolve_wrap_plan, unit_roots
from trainer.errors import ConfigError, WrapPlanError
from trainer.policies import build_policy
from trainer.policies.act import ACTConfig
from trainer.policies.diffusion.config import DiffusionConfig
from trainer.policies.fastwam import FastWAMConfig
from trainer.policies.mlp import MLPConfig
from trainer.policies.pi import PI05Config
from trainer.policies.smolvla import SmolVLAConfig


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (
            ["--policy.type=nope"],
            r"--policy.type='nope' is unknown: choose one of act, act_state, diffusion, fastwam, mlp",
        ),
        (["--policy.type=no.such.module:Cfg"], r"cannot import Cfg from no.such.module"),
        (["--parallelism.cp_size=2"], r"--parallelism.cp_size=2 is not supported"),
        (["--parallelism.tp_size=2"], r"--parallelism.tp_size=2 is not supported"),
        (["--parallelism.dp_shard=0"], r"--parallelism.dp_shard must be >= 1 or -1"),
        (
            ["--accelerator.fsdp.wrap_modules=[ACTEncoderLayer]", "--accelerator.fsdp.min_num_params=100"],
            r"wrap_modules and --accelerator.fsdp.min_num_params both choose",
        ),
        (["--accelerator.fsdp.mixed_precision_policy.reduce_dtype=float32"], r"needs param_dtype too"),
        (
            ["--accelerator.fsdp.mixed_precision_policy.param_dtype=float16"],
            r"float16 parameters .* set --accelerator.mixed_precision=fp16",
        ),
        (["--accelerator.fsdp.ignored_modules=("], r"not a valid regex"),
        (["--accelerator.mixed_precision=fp8"], r"--accelerator.mixed_precision='fp8' is not one of"),
        (["--accelerator.gradient_accumulation.steps=0"], r"gradient_accumulation.steps must be >= 1"),
        (["--checkpoint_format=zip"], r"--checkpoint_format='zip' is not one of"),
        (
            ["--save_shard_size=5 gigs"],
            r"--save_shard_size '5 gigs' is not a size; use e.g. 5GB, 500MB or 2GiB",
        ),
        (["--save_shard_size=0MiB"], r"--save_shard_size '0MiB' must be positive"),
        (["--batch_size=0"], r"--batch_size must be >= 1"),
        (["--policy.dim=30", "--policy.heads=4"], r"--policy.dim=30 must be divisible by --policy.heads=4"),
        (
            ["--dataset.type=atari"],
            r"--dataset.type='atari' is unknown: choose one of lerobot, mixture, pendulum",
        ),
        (["--no_such_flag=1"], r"unrecognized arguments: --no_such_flag"),
    ],
)
def test_invalid_flags_are_one_line_errors(args: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        parse_config(args)
    assert "\n" not in str(info.value)


def test_json_round_trip_reproduces_the_config(tmp_path) -> None:
    config = parse_config(
        ["--policy.type=mlp", "--policy.blocks=3", "--steps=7", "--parallelism.dp_shard=-1"]
    )
    path = tmp_path / "train_config.json"
    path.write_text(json.dumps(encode_config(config)))
    again = parse_config([f"--config_path={path}"])
    assert encode_config(again) == encode_config(config)
    assert again.config_path == str(path)
    assert parse_config([f"--config_path={path}", "--steps=9"]).steps == 9


@dataclass
class CustomConfig(MLPConfig):
    """A user's policy config, known to the trainer only by its import path."""


def test_policy_registered_by_import_path() -> None:
    name = f"{__name__}:CustomConfig"
    config = parse_config([f"--policy.type={name}", "--policy.blocks=1"])
    assert type(config.policy) is CustomConfig
    assert config.policy.to_dict()["type"] == name
    assert type(parse_config([f"--policy.type={name}"]).policy) is CustomConfig
    with pytest.raises(ConfigError, match="is not a PolicyConfig subclass"):
        parse_config([f"--policy.type={__name__}:_Block"])


def test_policy_fields_without_type_mean_the_default_policy() -> None:
    assert parse_config(["--policy.dim=16", "--policy.heads=2"]).policy.dim == 16


@pytest.mark.parametrize(
    ("replicate", "shard", "world", "expected"),
    [(1, 1, 1, (1, 1)), (1, 1, 4, (4, 1)), (1, -1, 4, (1, 4)), (2, -1, 4, (2, 2)), (2, 2, 4, (2, 2))],
)
def test_topology_resolution(replicate: int, shard: int, world: int, expected: tuple[int, int]) -> None:
    topo = resolve_topology(ParallelismConfig(dp_replicate=replicate, dp_shard=shard), world)
    assert (topo.dp_replicate, topo.dp_shard) == expected


def test_degrees_not_matching_world_name_every_degree() -> None:
    with pytest.raises(ConfigError) as info:
        resolve_topology(ParallelismConfig(dp_replicate=2, dp_shard=3), 4)
    message = str(info.value)
    for part in ("dp_replicate=2", "dp_shard=3", "cp_size=1", "tp_size=1", "= 6", "4 processes"):
        assert part in message


def test_dp_shard_fill_needs_divisible_world() -> None:
    with pytest.raises(
        ConfigError, match=r"dp_shard=-1 cannot fill the world: world size 4 is not divisible"
    ):
        resolve_topology(ParallelismConfig(dp_replicate=3, dp_shard=-1), 4)


@pytest.mark.parametrize("fmt", ["dcp", "safetensors_dcp"])
def test_dcp_formats_need_a_sharded_run(fmt: str) -> None:
    ddp = resolve_topology(ParallelismConfig(), 2)
    with pytest.raises(ConfigError, match=rf"--checkpoint_format={fmt} needs a sharded run \(DDP 2 is not\)"):
        check_checkpoint_format(fmt, ddp)
    check_checkpoint_format(fmt, resolve_topology(ParallelismConfig(dp_shard=2), 2))


def test_env_guard_names_the_variables() -> None:
    env = {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", "PARALLELISM_CONFIG_DP_SHARD_SIZE": "2"}
    with pytest.raises(ConfigError) as info:
        check_accelerate_env(env)
    for name in env:
        assert name in str(info.value)
    assert ALLOW_ENV in str(info.value)
    for name in ("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "ACCELERATE_MIXED_PRECISION"):
        with pytest.raises(ConfigError, match=name):
            check_accelerate_env({name: "4" if "STEPS" in name else "bf16"})


def test_env_guard_allows_plain_launcher_values_and_the_override() -> None:
    # what `accelerate launch` without a config exports
    check_accelerate_env({"ACCELERATE_MIXED_PRECISION": "no", "ACCELERATE_USE_FSDP": "false", "PATH": "/bin"})
    check_accelerate_env({"ACCELERATE_USE_FSDP": "true", ALLOW_ENV: "1"})


def test_only_the_mesh_slicing_deprecation_warning_is_silenced() -> None:
    """torch's warning about accelerate's mesh slicing is noise to the user; every other one stays."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _quiet_mesh_slicing_warning()
        warnings.warn(
            "Slicing a flattened dim from root mesh will be deprecated in PT 2.11. "
            "Users need to bookkeep the flattened mesh directly. ",
            UserWarning,
            stacklevel=1,
        )
        warnings.warn("Slicing a tensor is fine", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["Slicing a tensor is fine"]


def _policy(policy_type: str = "act_state"):
    return build_policy(parse_config([f"--policy.type={policy_type}"]).policy, 3, 1)


def test_wrap_plan_from_policy_flag_or_size() -> None:
    policy = _policy()
    fsdp = parse_config([]).accelerator.fsdp
    assert resolve_wrap_plan(policy, fsdp) == WrapPlan(class_names=("StateEncoderLayer", "StateDecoderLayer"))
    fsdp.wrap_modules = ["StateEncoderLayer"]
    assert unit_roots(policy, resolve_wrap_plan(policy, fsdp)) == ["", "encoder.0", "encoder.1"]
    fsdp.wrap_modules = None


@pytest.mark.parametrize(
    ("policy_type", "threshold", "classes", "roots"),
    [
        # the blocks' ModuleList is above the threshold too: looked through, never a unit
        (
            "act_state",
            5000,
            ("StateEncoderLayer", "StateDecoderLayer"),
            ["", "encoder.0", "encoder.1", "decoder.0"],
        ),
        ("mlp", 10000, ("MLPBlock",), ["", "blocks.0", "blocks.1"]),  # not the Linear inside each block
        ("mlp", 10**9, (), [""]),
    ],
)
def test_size_based_units_skip_containers(policy_type, threshold, classes, roots) -> None:
    policy = _policy(policy_type)
    fsdp = parse_config([f"--accelerator.fsdp.min_num_params={threshold}"]).accelerator.fsdp
    plan = resolve_wrap_plan(policy, fsdp)
    assert plan == WrapPlan(class_names=classes, min_num_params=threshold)
    assert unit_roots(policy, plan) == roots
    assert all(type(policy.get_submodule(r)).forward is not nn.Module.forward for r in roots)


def test_size_based_units_look_through_a_wrapper_of_everything() -> None:
    wrapped = nn.Sequential(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2)))
    fsdp = parse_config(["--accelerator.fsdp.min_num_params=1000"]).accelerator.fsdp
    assert unit_roots(wrapped, resolve_wrap_plan(wrapped, fsdp)) == ["", "0.0", "0.2"]


def test_wrap_modules_must_exist() -> None:
    policy = _policy()
    fsdp = parse_config([]).accelerator.fsdp
    fsdp.wrap_modules, fsdp.min_num_params = ["Nope"], None
    with pytest.raises(WrapPlanError, match=r"wrap module class\(es\) Nope not found in ACTStatePolicy"):
        resolve_wrap_plan(policy, fsdp)


class _NoUnits(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 2)


def test_policy_without_wrap_units_is_refused_under_fsdp() -> None:
    with pytest.raises(WrapPlanError, match=r"_NoUnits declares no _fsdp_wrap_modules.*--accelerator.fsdp"):
        resolve_wrap_plan(_NoUnits(), parse_config([]).accelerator.fsdp)


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)


class _Tied(nn.Module):
    _fsdp_wrap_modules = ("_Block",)

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = _Block(), _Block()
        self.second.proj.weight = self.first.proj.weight


def test_tied_weights_split_across_units_are_named() -> None:
    model = _Tied()
    with pytest.raises(WrapPlanError) as info:
        check_tied_weights(model, WrapPlan(class_names=("_Block",)))
    assert "first.proj.weight, second.proj.weight" in str(info.value)
    assert "'first'" in str(info.value) and "'second'" in str(info.value)
    check_tied_weights(model, WrapPlan(class_names=("_Tied",)))  # one unit holds both: fine


def test_policy_dtype_casts_parameters_only() -> None:
    config = parse_config(["--policy.type=mlp", "--policy.dtype=bfloat16"]).policy
    assert {p.dtype for p in build_policy(config, 3, 1).parameters()} == {torch.bfloat16}


def test_docs_flag_table_is_the_one_generated_from_the_config() -> None:
    """docs/training.md lists every config field with its default: the table is `markdown_table()`,
    the same whatever policies a user's package has registered in the process (the toy here)."""
    page = (Path(__file__).parents[2] / "docs" / "training.md").read_text()
    documented = page.split("<!-- flags:begin -->\n")[1].split("\n<!-- flags:end -->")[0]
    assert documented == markdown_table(), (
        "docs/training.md's flag table is stale: regenerate it with "
        '`python -c "from trainer.cli.flags import markdown_table; print(markdown_table())"`'
    )


def test_every_config_field_is_a_documented_flag() -> None:
    """The walk misses no leaf field, every flag has a meaning, and `trainer train --help` lists them."""
    names = [flag.name for flag in all_flags()]
    leaves = set(_leaf_flags(encode_config(parse_config([])), "--"))
    leaves |= {f"--policy.{field.name}" for field in dataclasses.fields(MLPConfig)}
    leaves |= {f"--policy.{field.name}" for field in dataclasses.fields(ACTConfig)}
    leaves |= {f"--policy.{field.name}" for field in dataclasses.fields(SmolVLAConfig)}
    leaves |= {f"--policy.{field.name}" for field in dataclasses.fields(DiffusionConfig)}
    leaves |= {f"--policy.{field.name}" for field in dataclasses.fields(PI05Config)}
    leaves |= {f"--policy.{field.name}" for field in dataclasses.fields(FastWAMConfig)}
    leaves |= {f"--dataset.{field.name}" for field in dataclasses.fields(MixtureConfig)} - {
        "--dataset.image_transforms"
    }
    leaves |= {
        f"--dataset.image_transforms.{field.name}" for field in dataclasses.fields(ImageTransformsConfig)
    }
    for registry, section in (
        (OptimizerConfig, "optimizer"),
        (SchedulerConfig, "scheduler"),
        (EnvConfig, "env"),
    ):
        for choice in registry.get_known_choices().values():
            leaves |= {f"--{section}.{field.name}" for field in dataclasses.fields(choice)}
    leaves = (leaves - {"--env"}) | {"--env.type"}  # unset by default: its type and every type's fields
    assert leaves | {"--config_path"} == set(names) and len(names) == len(set(names))
    assert all(flag.meaning for flag in all_flags())
    help_lines = help_text().splitlines()
    assert [line.strip().split("=")[0] for line in help_lines[::2]] == names


def _leaf_flags(tree: dict, prefix: str) -> list[str]:
    """Dotted flag names of a train_config.json (what draccus encodes: every field); an empty dict is
    a dict-valued flag's default (--rename_map), not a section."""
    flags = []
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flags += _leaf_flags(value, f"{prefix}{key}.")
        else:
            flags.append(f"{prefix}{key}")
    return flags


@pytest.mark.parametrize(
    "env",
    [
        {"ACCELERATE_DYNAMO_BACKEND": "EAGER"},
        {"ACCELERATE_USE_DEEPSPEED": "true"},
        {"ACCELERATE_TORCH_DEVICE": "cuda:1"},
        {"ACCELERATE_USE_CPU": "True"},
    ],
)
def test_env_guard_refuses_every_accelerate_variable_that_changes_the_run(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match=next(iter(env))):
        check_accelerate_env(env)


def test_env_guard_passes_what_a_plain_accelerate_launch_exports() -> None:
    check_accelerate_env(
        {
            "ACCELERATE_DYNAMO_BACKEND": "NO",
            "ACCELERATE_DYNAMO_MODE": "default",
            "ACCELERATE_DYNAMO_USE_FULLGRAPH": "False",
            "ACCELERATE_USE_CPU": "False",
            "ACCELERATE_MIXED_PRECISION": "no",
            "ACCELERATE_LOG_LEVEL": "info",
            "ACCELERATE_CPU_AFFINITY": "1",
        }
    )


def test_one_argv_pre_pass_accepts_both_spellings(tmp_path, monkeypatch):
    from trainer.cli.parse import normalize_argv

    assert normalize_argv(["--steps", "5", "--resume=true", "--policy.path", "/x", "--output_dir", "d"]) == [
        "--steps=5",
        "--resume=true",
        "--policy.path=/x",
        "--output_dir=d",
    ]
    monkeypatch.chdir(tmp_path)
    spaced = parse_config(["--steps", "7", "--output_dir", "runs/a", "--policy.type", "mlp"])
    joined = parse_config(["--steps=7", "--output_dir=runs/a", "--policy.type=mlp"])
    assert encode_config(spaced) == encode_config(joined)
    assert spaced.steps == 7 and spaced.policy.type == "mlp"
    assert spaced.output_dir == str(tmp_path / "runs" / "a")  # resolved once, absolute
    assert spaced.flags_given == joined.flags_given


def test_async_save_needs_a_sharded_run():
    from ckpt_tools.training import Topology
    from trainer.engine.checkpoint.saving import check_async_save

    config = parse_config(["--async_save=true"])
    with pytest.raises(
        ConfigError, match=r"--async_save=true writes a sharded run's DCP shards .* DDP 2 run"
    ):
        check_async_save(config.async_save, Topology(dp_replicate=2))
    check_async_save(config.async_save, Topology(dp_shard=2))  # FSDP2: accepted
    check_async_save(parse_config([]).async_save, Topology(dp_replicate=2))  # not asked for: nothing to check


# ----------------------------------------------------------------- a saved file names no code


def _tripwire_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> Path:
    """A module on sys.path whose import leaves a marker file: the code a hostile checkpoint names."""
    marker = tmp_path / f"{name}.imported"
    (tmp_path / f"{name}.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
        "from trainer.data.embedded.pendulum import PendulumConfig\n"
        "from trainer.policies.mlp import MLPConfig\n"
        "class Data(PendulumConfig):\n    pass\n"
        "class Policy(MLPConfig):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return marker


@pytest.mark.parametrize("section", ["policy", "dataset"])
def test_a_saved_config_naming_a_module_is_refused_unless_allowed(tmp_path, monkeypatch, section) -> None:
    """A train_config.json (a checkpoint's, read by a resume) whose type is `module:Class` imports
    nothing: one line naming the type and --allow_types; with that flag, the type loads."""
    name = f"tripwire_{section}"
    marker = _tripwire_module(tmp_path, monkeypatch, name)
    type_name = f"{name}:{'Data' if section == 'dataset' else 'Policy'}"
    saved = tmp_path / "train_config.json"
    saved.write_text(json.dumps({section: {"type": type_name}}))
    with pytest.raises(ConfigError) as refused:
        parse_config([f"--config_path={saved}"])
    message = str(refused.value)
    assert f"the {section} type of {saved} is '{type_name}', which would import and run" in message
    assert f"--allow_types={type_name}" in message and "\n" not in message
    assert not marker.exists()
    config = parse_config([f"--config_path={saved}", f"--allow_types={type_name}"])
    assert marker.exists() and getattr(config, section).type == type_name


def test_a_policy_class_that_builds_no_policy_is_one_line() -> None:
    """`policy_class()` is typed as any module factory (config/ names no class above it): what it
    builds must still be a `Policy`, checked by `build_policy`."""
    from trainer.config.policy import PolicyConfig

    @dataclass
    class NotAPolicyConfig(PolicyConfig):  # not registered: no other test sees it
        def policy_class(self):  # type: ignore[no-untyped-def]
            return lambda config: torch.nn.Linear(1, 1)

    with pytest.raises(ConfigError, match=r"^NotAPolicyConfig.policy_class\(\) built a Linear, not a"):
        build_policy(NotAPolicyConfig(), 1, 1)
