"""`ckpt inspect` and `describe_checkpoint`: what a checkpoint holds, read from metadata only."""

from __future__ import annotations

import json
from pathlib import Path

import fsspec
import pytest
import torch
from report_fixtures import fsdp_checkpoint, run_ckpt, tiny_model_state, write_step_dir
from safetensors.torch import save_file

from ckpt_tools import layout
from ckpt_tools.dcp.index import read_dcp_index
from ckpt_tools.errors import NotACheckpointError
from ckpt_tools.format.dtypes import safetensors_code
from ckpt_tools.reports.describe import describe_checkpoint


@pytest.fixture(scope="module")
def fsdp_step(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fsdp_checkpoint(tmp_path_factory)


def expected_rows(state: dict[str, torch.Tensor]) -> dict[str, tuple[str, tuple[int, ...], int]]:
    return {
        name: (safetensors_code(str(t.dtype)), tuple(t.shape), t.numel() * t.element_size())
        for name, t in state.items()
    }


def rows(group) -> dict[str, tuple[str, tuple[int, ...], int]]:  # type: ignore[no-untyped-def]
    return {t.name: (t.dtype, t.shape, t.nbytes) for t in group.tensors}


def test_safetensors_step_dir(tmp_path: Path) -> None:
    step_dir = write_step_dir(tmp_path, "safetensors")
    description = describe_checkpoint(step_dir)
    step = description.training_step
    assert step is not None and step.step == 5 and step.effective_batch_size == 16
    assert description.formats == ("safetensors", "optimizer safetensors")
    assert rows(description.weights) == expected_rows(tiny_model_state())
    assert description.to_dict()["effective_batch"] == "8 x 1 x 2 = 16"


def test_last_and_output_dir_resolve_to_the_step(tmp_path: Path) -> None:
    checkpoints = tmp_path / "run" / layout.CHECKPOINTS_DIR
    step_dir = write_step_dir(checkpoints, "dcp", dp_shard=2)
    (checkpoints / layout.LAST).symlink_to(step_dir.name)
    for path in (checkpoints / layout.LAST, tmp_path / "run"):
        description = describe_checkpoint(path)
        assert description.step_dir is not None and Path(description.step_dir).name == step_dir.name
        assert description.formats == ("dcp", "optimizer dcp")


def test_fsdp_dcp_lists_full_shapes_from_uneven_shards(fsdp_step: Path) -> None:
    description = describe_checkpoint(fsdp_step)
    assert description.formats == ("safetensors", "dcp", "optimizer dcp")
    groups = {g.label: g for g in description.groups}
    assert rows(groups["dcp"]) == rows(groups["safetensors"])
    assert rows(groups["dcp"])["0.weight"] == ("F32", (7, 4), 112)
    # the shards really are uneven: 7 rows split 4 + 3 across the two ranks
    index = read_dcp_index(fsdp_step / layout.PRETRAINED_MODEL_DIR / layout.MODEL_DCP_DIR)
    assert sorted(c.sizes for c in index.tensors["0.weight"].chunks) == [(3, 4), (4, 4)]
    assert description.training_step.topology.describe() == "FSDP2 2"


def test_bare_model_dir_has_no_training_state(tmp_path: Path) -> None:
    save_file(tiny_model_state(), str(tmp_path / layout.MODEL_SAFETENSORS))
    description = describe_checkpoint(tmp_path)
    assert description.training_step is None and description.step_dir is None
    assert description.formats == ("safetensors",)
    assert description.to_dict()["step"] is None


def test_sharded_safetensors_lists_every_shard(tmp_path: Path) -> None:
    state = tiny_model_state()
    names = sorted(state)
    shards = {layout.sharded_model_name(1, 2): names[:2], layout.sharded_model_name(2, 2): names[2:]}
    weight_map = {}
    for shard, keys in shards.items():
        save_file({k: state[k] for k in keys}, str(tmp_path / shard))
        weight_map.update(dict.fromkeys(keys, shard))
    (tmp_path / layout.MODEL_INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    description = describe_checkpoint(tmp_path)
    assert description.formats == ("sharded safetensors",)
    assert rows(description.weights) == expected_rows(state)


def test_single_file_and_bare_dcp_directory(tmp_path: Path) -> None:
    step_dir = write_step_dir(tmp_path, "safetensors_dcp", dp_shard=2)
    model_dir = step_dir / layout.PRETRAINED_MODEL_DIR
    assert describe_checkpoint(model_dir / layout.MODEL_SAFETENSORS).formats == ("safetensors",)
    assert rows(describe_checkpoint(model_dir / layout.MODEL_DCP_DIR).weights) == expected_rows(
        tiny_model_state()
    )
    optimizer = describe_checkpoint(step_dir / layout.TRAINING_STATE_DIR / layout.OPTIMIZER_DCP_DIR)
    assert optimizer.formats == ("optimizer dcp",) and optimizer.weights.objects == 1


def test_reads_a_checkpoint_on_an_fsspec_store(tmp_path: Path) -> None:
    step_dir = write_step_dir(tmp_path, "safetensors_dcp", dp_shard=2)
    fs = fsspec.filesystem("memory")
    for path in step_dir.rglob("*"):
        if path.is_file():
            fs.pipe_file(f"/inspect-run/{path.relative_to(tmp_path)}", path.read_bytes())
    description = describe_checkpoint(f"memory://inspect-run/{step_dir.name}")
    assert description.formats == ("safetensors", "dcp", "optimizer dcp")
    assert rows(description.weights) == expected_rows(tiny_model_state())


def test_empty_directory_is_not_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(NotACheckpointError, match="holds no model weights"):
        describe_checkpoint(tmp_path)


def test_cli_summary_by_default(fsdp_step: Path) -> None:
    result = run_ckpt("inspect", fsdp_step)
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    for text in ("FSDP2 2", "2 x 2 x 1 = 4", "safetensors_dcp", "safetensors, dcp, optimizer dcp"):
        assert text in out, text
    # per-module totals (the tiny Sequential's modules "0" and "2"), no tensor rows
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in out.splitlines() if "│" in line]
    assert cells == [["0", "2", "35", "140 B"], ["2", "2", "24", "96 B"], ["total", "4", "59", "236 B"]]
    assert "0.weight" not in out and "(7, 4)" not in out
    assert result.stderr.strip() == "every tensor: ckpt inspect --tensors"


def test_cli_tensors_lists_every_tensor(fsdp_step: Path) -> None:
    result = run_ckpt("inspect", fsdp_step, "--tensors")
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "0.weight" in out and "(7, 4)" in out and "112 B" in out and "total: 4 tensors" in out
    assert result.stderr == ""


def test_cli_json(fsdp_step: Path) -> None:
    result = run_ckpt("inspect", fsdp_step, "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["step"] == 1 and data["topology"] == "FSDP2 2" and data["effective_batch_size"] == 4
    assert data["formats"] == ["safetensors", "dcp", "optimizer dcp"]
    dcp_group = next(g for g in data["groups"] if g["label"] == "dcp")
    assert {t["name"]: t["shape"] for t in dcp_group["tensors"]} == {
        "0.weight": [7, 4],
        "0.bias": [7],
        "2.weight": [3, 7],
        "2.bias": [3],
    }
    assert dcp_group["total_bytes"] == 4 * (28 + 7 + 21 + 3)
