"""The public surface of `ckpt_tools` is exactly this list, every name resolves, type checkers see
the same names with their real types, and importing the package or running the metadata commands
never imports torch (which alone takes ~2 s here)."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from pathlib import Path

import pytest
import torch
from report_fixtures import write_step_dir

import ckpt_tools
import ckpt_tools.training
from helpers.lazy_exports import modules_after, type_checking_imports
from helpers.tiny_run import training_step

# Adding a name here is a decision about the stable API evaluation pipelines use (the top level).
PUBLIC = {
    # errors
    "CheckpointError",
    "CorruptCheckpointError",
    "LegacyCheckpointError",
    "UnsupportedVersionError",
    "PublishError",
    # one line for an error; a malformed request
    "UsageError",
    "one_line",
    # a step's training_step.json and config.json; a run's newest step
    "TrainingStep",
    "CheckpointFormat",
    "read_training_step",
    "read_config_json",
    "latest_step_dir",
    # evaluation pipelines: open, describe, check, load
    "Checkpoint",
    "open_checkpoint",
    "load_model_state_dict",
    "ProcessorState",
    "load_processors",
    "CheckpointDescription",
    "describe_checkpoint",
    "VerifyReport",
    "verify_checkpoint",
    # a run's steps ranked by their evaluation scores (eval.json)
    "Ranking",
    "read_scores",
    "best_steps",
    "default_mode",
    # adapters, conversion, publishing
    "merge_lora",
    "merge_adapter_dir",
    "ConversionResult",
    "convert_dcp_to_safetensors",
    "convert_safetensors_to_dcp",
    "parse_size",
    "dtype_name",
    "PublishResult",
    "publish_model",
    "select_publish_files",
    "is_fsspec_target",
    # every directory and file name of the format; file access on local disk or any fsspec store; the
    # trainer's tier
    "layout",
    "storage",
    "training",
}

# ... and about the stable API between a training loop and its checkpoints (`ckpt_tools.training`):
# the collective save and the two-phase resume (docs/api.md).
TRAINING = {
    # saving, on every rank; the main rank decides, every rank gets the value or the same error
    "prepare_save_groups",
    "SaveRequest",
    "save_checkpoint",
    "start_checkpoint",
    "PendingCheckpoint",
    "save_rng_state",
    "SaveFailedError",
    "main_decides",
    # a run's evaluated steps: scores written, the `best` pointer, retention
    "write_scores",
    "point_best",
    "prune_steps",
    # resuming: the plan before prepare, the state after
    "Topology",
    "SamplerPosition",
    "RunShape",
    "ResumePlan",
    "plan_resume",
    "ResumeRefusedError",
    "load_rng_state",
    "load_training_state",
    "load_model_weights",
    # continuing a LeRobot run (docs/resume.md)
    "is_lerobot_checkpoint",
    "check_lerobot_resumable",
    "read_lerobot_training_step",
    "load_lerobot_rng_state",
    "load_lerobot_training_state",
    # the way back: a step of ours as LeRobot main's (trainer export --lerobot_step)
    "read_named_optimizer_state",
    "write_lerobot_training_state",
}

TIERS = {"ckpt_tools": (ckpt_tools, PUBLIC), "ckpt_tools.training": (ckpt_tools.training, TRAINING)}
NAMES = [
    (tier, name)
    for tier, (_, names) in TIERS.items()
    for name in sorted(names - {"layout", "storage", "training"})
]


@pytest.mark.parametrize("tier", sorted(TIERS))
def test_all_is_exactly_the_public_list(tier: str) -> None:
    module, names = TIERS[tier]
    assert set(module.__all__) == names
    assert module.__all__ == sorted(module.__all__)
    assert dir(module) == module.__all__


def test_a_name_is_in_one_tier() -> None:
    assert not PUBLIC & TRAINING


@pytest.mark.parametrize(("tier", "name"), [*NAMES, ("ckpt_tools", "layout"), ("ckpt_tools", "storage")])
def test_every_public_name_resolves(tier: str, name: str) -> None:
    member = getattr(TIERS[tier][0], name)
    assert getattr(member, "__name__", name).rsplit(".", 1)[-1] == name


@pytest.mark.parametrize("tier", sorted(TIERS))
def test_type_checkers_see_the_lazy_table(tier: str) -> None:
    """The `TYPE_CHECKING` imports (what mypy and editors read), the lazy table (what runs) and
    `__all__` (what pdoc documents) name the same objects from the same modules."""
    module = TIERS[tier][0]
    lazy = {**module._EXPORTS, **module._MODULES}
    assert type_checking_imports(module, module._MODULES.values()) == lazy
    assert set(lazy) == set(module.__all__)


@pytest.mark.parametrize(("tier", "name"), NAMES)
def test_the_table_names_where_each_name_is_defined(tier: str, name: str) -> None:
    """So `nox -s typecheck`'s strict run over the table's modules checks each definition itself."""
    module = TIERS[tier][0]
    assert getattr(module, name).__module__ == module._EXPORTS[name]


def test_the_trainers_tier_is_not_at_the_top_level() -> None:
    with pytest.raises(AttributeError, match="module 'ckpt_tools' has no attribute 'start_checkpoint'"):
        _ = ckpt_tools.start_checkpoint
    assert ckpt_tools.training is importlib.import_module("ckpt_tools.training")


@pytest.mark.parametrize("name", ["save_checkpoint", "start_checkpoint"])
def test_a_save_takes_one_typed_request(name: str) -> None:
    """Both entries of a save take one `SaveRequest` (positional), so a field added is added to both and
    a caller's options are type-checked where the request is built."""
    (parameter,) = inspect.signature(getattr(ckpt_tools.training, name)).parameters.values()
    assert parameter.kind is inspect.Parameter.POSITIONAL_ONLY
    assert parameter.annotation in ("SaveRequest", ckpt_tools.training.SaveRequest)


def test_a_save_request_is_keyword_only_and_frozen() -> None:
    request = ckpt_tools.training.SaveRequest(
        checkpoints_dir="run/checkpoints",
        training_step=training_step(1),
        model=torch.nn.Linear(1, 1),
        optimizer=torch.optim.SGD(torch.nn.Linear(1, 1).parameters()),
        policy_config={},
        train_config={},
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.keep_last = 3  # type: ignore[misc]
    assert dataclasses.replace(request, keep_last=3).keep_last == 3
    with pytest.raises(TypeError, match="positional"):
        ckpt_tools.training.SaveRequest("run/checkpoints")  # type: ignore[misc,call-arg]


def test_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'layout_internals'"):
        _ = ckpt_tools.layout_internals


def test_import_does_not_import_torch() -> None:
    modules = modules_after(
        "import ckpt_tools; ckpt_tools.TrainingStep; ckpt_tools.describe_checkpoint; ckpt_tools.training.__all__"
    )
    assert "torch" not in modules and "safetensors" not in modules


@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_metadata_commands_do_not_import_torch(tmp_path: Path, command: str) -> None:
    step_dir = write_step_dir(tmp_path, "safetensors_dcp", dp_shard=2)
    code = (
        "import sys\nfrom ckpt_tools.cli.app import main\n"
        f"sys.argv = ['ckpt', {command!r}, {str(step_dir)!r}, '--json']\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    assert not exc.code, exc.code"
    )
    modules = modules_after(code)
    assert "torch" not in modules and "numpy" not in modules
