"""The run plan: a config is resolved once, the caller's object is never edited, and train_config.json
records what the run resolved (absolute output_dir, resume false, the layout and format settled for a
resume on another world size, torch's effective reduce dtype, the data's features, the W&B run id)."""

from __future__ import annotations

import ast
import contextlib
import copy
import io
import json
import os
import re
from pathlib import Path

import pytest

from helpers.run_outputs import saved_model
from helpers.train_flags import tiny_args
from trainer.cli.parse import parse_config
from trainer.config.accelerator import MixedPrecisionPolicyConfig
from trainer.config.train import encode_config
from trainer.engine.plan import train

TRAINER_SRC = Path(__file__).parents[2] / "packages" / "trainer" / "src" / "trainer"
# Names the engine binds config objects to: an attribute assigned through one of them edits a config.
CONFIG_NAMES = {"config", "settings", "mpp", "fsdp", "acc", "policy_config", "plan"}
PARSING = {"cli/parse.py"}  # parse_config sets config_path, flags_given, the absolute output_dir


@pytest.fixture(scope="module")
def resumed(tmp_path_factory: pytest.TempPathFactory, dataset_cache: str):
    """A DCP FSDP2 run's saved config, resumed on one process from a relative --output_dir that holds
    no checkpoint: the plan settles the layout and the format, and starts fresh. Returns the parsed
    config, its deep copy taken before train(), the run directory and the run's stderr."""
    from accelerate.state import AcceleratorState

    root = tmp_path_factory.mktemp("plan")
    saved = parse_config(
        tiny_args(
            "elsewhere",
            dataset_cache,
            "--policy.type=mlp",
            "--steps=2",
            "--parallelism.dp_shard=2",
            "--checkpoint_format=dcp",
            "--accelerator.fsdp.mixed_precision_policy.param_dtype=bfloat16",
            "--wandb.enable=true",
            "--wandb.mode=disabled",
        )
    )
    (root / "train_config.json").write_text(json.dumps(encode_config(saved)))
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        for name in list(os.environ):
            if name.startswith(("ACCELERATE_", "FSDP_", "PARALLELISM_CONFIG_")) or name in (
                "WORLD_SIZE",
                "RANK",
            ):
                patch.delenv(name)
        patch.setenv("WANDB_SILENT", "true")
        config = parse_config(["--config_path=train_config.json", "--resume=true", "--output_dir=run"])
        before = copy.deepcopy(config)
        AcceleratorState._reset_state(reset_partial_state=True)
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                train(config)
        finally:
            AcceleratorState._reset_state(reset_partial_state=True)
    return config, before, root / "run", err.getvalue()


def test_train_leaves_the_callers_config_unchanged(resumed) -> None:
    config, before, _, _ = resumed
    assert config == before
    assert (config.config_path, config.flags_given) == (before.config_path, before.flags_given)
    assert (config.parallelism.dp_shard, config.checkpoint_format, config.wandb.run_id) == (2, "dcp", None)


def test_train_config_json_records_the_resolved_plan(resumed) -> None:
    _, _, out, err = resumed
    model_dir = saved_model(out)
    saved = json.loads((model_dir / "train_config.json").read_text())
    assert saved["output_dir"] == str(out) and os.path.isabs(saved["output_dir"])
    assert saved["resume"] is False
    assert (saved["parallelism"]["dp_replicate"], saved["parallelism"]["dp_shard"]) == (1, -1)
    assert saved["checkpoint_format"] == "safetensors"
    effective = MixedPrecisionPolicyConfig(param_dtype="bfloat16").effective_reduce_dtype()
    assert effective is not None
    assert saved["accelerator"]["fsdp"]["mixed_precision_policy"]["reduce_dtype"] == effective
    assert saved["policy"]["input_features"] == ["observation.state"]
    assert re.fullmatch(r"[0-9a-f]{8}", saved["wandb"]["run_id"])
    policy = json.loads((model_dir / "config.json").read_text())
    assert (policy["obs_dim"], policy["action_dim"], policy["input_features"]) == (
        3,
        1,
        ["observation.state"],
    )
    # the notes the plan resolved, and the fresh start, each in one line naming the directory
    assert f"--resume=true: no checkpoint under {out}: starting a fresh run\n" in err
    assert "the saved --parallelism.dp_replicate=1 --parallelism.dp_shard=2 does not fit 1 processes" in err
    assert "this single process run saves --checkpoint_format=safetensors" in err
    assert f"every 2 steps in {out}\n" in err  # the banner names the directory the run writes to


def _config_edits(path: Path) -> list[str]:
    """`x.field = ...` (or `+=`) where x is reached through a config-holding name (config.policy.dims,
    mpp.reduce_dtype, settings.run_id): an edit of a config object."""
    edits = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        for target in targets:
            chain = []
            while isinstance(target, ast.Attribute):
                chain.append(target.attr)
                target = target.value
            rooted = isinstance(target, ast.Name) and target.id != "self"
            if chain and rooted and (target.id in CONFIG_NAMES or CONFIG_NAMES & set(chain[1:])):
                edits.append(f"{path.relative_to(TRAINER_SRC)}:{node.lineno}")
    return edits


def test_no_module_edits_a_config_after_parsing() -> None:
    """The grep behind "nothing edits the config after parse_config", made a test."""
    found = [
        edit
        for path in sorted(TRAINER_SRC.rglob("*.py"))
        if path.relative_to(TRAINER_SRC).as_posix() not in PARSING
        for edit in _config_edits(path)
    ]
    assert found == []


def _train_config_parameters(path: Path) -> list[str]:
    """`name: TrainConfig` (or `TrainConfig | None`, `"TrainConfig"`) among a module's function
    parameters."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            arguments = node.args
            for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
                if arg.annotation is not None and "TrainConfig" in ast.unparse(arg.annotation):
                    found.append(f"{path.relative_to(TRAINER_SRC)}:{node.lineno} {node.name}({arg.arg})")
    return found


def test_only_the_cli_config_and_the_plan_take_the_whole_config() -> None:
    """Past engine/plan.py the engine reads the plan's sections (config/sections.py), never the
    parsed TrainConfig: a function elsewhere that takes one fails here."""
    allowed = ("cli/", "config/", "engine/plan.py")
    modules = sorted(TRAINER_SRC.rglob("*.py"))
    outside = [p for p in modules if not str(p.relative_to(TRAINER_SRC)).startswith(allowed)]
    assert len(outside) > 60  # the rule sees the engine, not an empty folder
    assert [found for path in outside for found in _train_config_parameters(path)] == []
    assert _train_config_parameters(TRAINER_SRC / "engine" / "plan.py")  # the detector finds them
