"""The public surface of `ckpt_tools` is exactly this list, every name resolves, type checkers see
the same names with their real types, and importing the package or running the metadata commands
never imports torch (which alone takes ~2 s here)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from report_fixtures import write_step_dir

import ckpt_tools
from helpers.lazy_exports import modules_after, type_checking_imports

# Adding a name here is a decision about the stable API the trainer and evaluation pipelines use.
PUBLIC = {
    # errors
    "CheckpointError",
    "CorruptCheckpointError",
    "LegacyCheckpointError",
    "UnsupportedVersionError",
    "ResumeRefusedError",
    "SaveFailedError",
    "PublishError",
    # training_step.json schema
    "TrainingStep",
    "Topology",
    "SamplerPosition",
    # saving and resuming
    "ProcessorState",
    "save_checkpoint",
    "start_checkpoint",
    "PendingCheckpoint",
    "prepare_save_groups",
    "load_training_state",
    "load_model_weights",
    "save_rng_state",
    "load_rng_state",
    "read_training_step",
    "latest_step_dir",
    # continuing a LeRobot run (docs/resume.md)
    "is_lerobot_checkpoint",
    "check_lerobot_resumable",
    "read_lerobot_training_step",
    "load_lerobot_rng_state",
    "load_lerobot_training_state",
    "read_config_json",
    "RunShape",
    "ResumePlan",
    "plan_resume",
    # evaluation pipelines: open, describe, check, load
    "Checkpoint",
    "open_checkpoint",
    "load_model_state_dict",
    "load_processors",
    "CheckpointDescription",
    "describe_checkpoint",
    "VerifyReport",
    "verify_checkpoint",
    # a step's evaluation scores (eval.json), the steps ranked by one figure, the `best` pointer
    "Ranking",
    "read_scores",
    "write_scores",
    "best_steps",
    "point_best",
    "prune_steps",
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
    # one line for an error; the main rank decides, every rank gets the value or the same error
    "UsageError",
    "CheckpointFormat",
    "one_line",
    "main_decides",
    # every directory and file name of the format; file access on local disk or any fsspec store
    "layout",
    "storage",
}


def test_all_is_exactly_the_public_list() -> None:
    assert set(ckpt_tools.__all__) == PUBLIC
    assert ckpt_tools.__all__ == sorted(ckpt_tools.__all__)
    assert dir(ckpt_tools) == ckpt_tools.__all__


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_every_public_name_resolves(name: str) -> None:
    member = getattr(ckpt_tools, name)
    assert getattr(member, "__name__", name).rsplit(".", 1)[-1] == name


def test_type_checkers_see_the_lazy_table() -> None:
    """The `TYPE_CHECKING` imports (what mypy and editors read), the lazy table (what runs) and
    `__all__` (what pdoc documents) name the same objects from the same modules."""
    lazy = {**ckpt_tools._EXPORTS, **ckpt_tools._MODULES}
    assert type_checking_imports(ckpt_tools, ckpt_tools._MODULES.values()) == lazy
    assert set(lazy) == set(ckpt_tools.__all__)


@pytest.mark.parametrize("name", sorted(set(PUBLIC) - {"layout", "storage"}))
def test_the_table_names_where_each_name_is_defined(name: str) -> None:
    """So `nox -s typecheck`'s strict run over the table's modules checks each definition itself."""
    assert getattr(ckpt_tools, name).__module__ == ckpt_tools._EXPORTS[name]


def test_save_checkpoint_takes_exactly_start_checkpoints_parameters() -> None:
    """`save_checkpoint` spells out `start_checkpoint`'s parameters so that callers are type-checked;
    a parameter added to one is added to the other."""
    save, start = (
        inspect.signature(ckpt_tools.save_checkpoint),
        inspect.signature(ckpt_tools.start_checkpoint),
    )
    assert save.parameters == start.parameters


def test_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'layout_internals'"):
        _ = ckpt_tools.layout_internals


def test_import_does_not_import_torch() -> None:
    modules = modules_after("import ckpt_tools; ckpt_tools.TrainingStep; ckpt_tools.describe_checkpoint")
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
