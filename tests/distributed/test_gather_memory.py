"""On CPU, an FSDP2 unit's gather holds its weights twice at most (the all-gather's buffer and the
weights copied out of it), never beside the previous unit's buffer: FSDP2 keeps that buffer in the
forward pass until the next gather is done, for a GPU's streams to overlap, and on CPU the engine has
it freed at the copy-out (distributed/factory.py). In the backward pass each unit is gathered when
its own backward starts, never prefetched. A real 2-rank `trainer train` of an MLP whose three hidden
blocks (FSDP2 units) weigh 64 MiB each, its resident memory read around each gather."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.launch import run_torchrun
from helpers.train_flags import tiny_args

pytestmark = pytest.mark.distributed

SCRIPT = Path(__file__).parent / "scripts" / "gather_memory.py"
WIDTH, BLOCKS = 4096, 3
UNIT_KIB = WIDTH * (WIDTH + 1) * 4 // 1024  # a block's float32 Linear, gathered whole


@pytest.fixture(scope="module")
def seen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One 2-rank run read by scripts/gather_memory.py: the prefix of its files."""
    tmp_path = tmp_path_factory.mktemp("gather_memory")
    flags = tiny_args(
        str(tmp_path / "run"),
        str(tmp_path / "cache"),
        "--policy.type=mlp",
        f"--policy.hidden_dim={WIDTH}",
        f"--policy.blocks={BLOCKS}",
        "--parallelism.dp_shard=2",
        "--steps=1",
        "--save_freq=1",
    )
    run_torchrun(SCRIPT, 2, str(tmp_path / "seen"), *flags, timeout=240)
    return tmp_path / "seen"


def test_a_units_gather_never_holds_a_third_copy_of_its_weights(seen: Path) -> None:
    for rank in range(2):
        gathers = json.loads(Path(f"{seen}.rank{rank}.json").read_text())
        assert len(gathers) == BLOCKS, gathers
        start = next(iter(gathers.values()))[0]  # resident before the first block's gather
        grew = [peak - start for _, peak in gathers.values()]
        # each gather is measured (buffer + weights: two copies), none adds a third
        assert all(1.5 * UNIT_KIB < kib < 2.5 * UNIT_KIB for kib in grew), (grew, UNIT_KIB)


def test_each_unit_is_gathered_when_its_own_backward_starts(seen: Path) -> None:
    """On CPU FSDP2 gathers no unit ahead of its backward (distributed/factory.py): a prefetched unit
    would sit beside the running unit's weights and full gradients, and one the backward never reaches
    (frozen, its outputs needing no gradient) would stay gathered until the backward ends."""
    for rank in range(2):
        gathers = json.loads(Path(f"{seen}.backward.rank{rank}.json").read_text())
        blocks = [unit for unit, _ in gathers if ".blocks." in f".{unit}"]
        assert len(blocks) == BLOCKS, gathers
        assert all(unit == starting for unit, starting in gathers), gathers
