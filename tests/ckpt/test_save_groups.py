"""The gloo groups a save writes its DCP parts on (one thread per part) are bounded like every other
collective of the run, and belong to the process group that is up now.

torch gives a new group a 30-minute timeout unless told otherwise, so a rank stalled inside a save would
hold every other rank that long; `prepare_save_groups(timeout)` passes the run's collective timeout on.
A process that tears its group down and starts another (a second run in one process, these tests) gets
new write groups rather than the dead ones."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import ckpt_tools
from ckpt_tools.state import save


def _start(rendezvous: Path) -> None:
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=0, world_size=1)


@pytest.fixture
def one_rank(tmp_path: Path) -> Iterator[Path]:
    _start(tmp_path / "rendezvous")
    try:
        yield tmp_path
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _timeout(group: dist.ProcessGroup) -> timedelta:
    return group._get_backend(torch.device("cpu")).options._timeout


def test_the_write_groups_wait_no_longer_than_the_timeout_given(one_rank: Path) -> None:
    ckpt_tools.training.prepare_save_groups(timedelta(seconds=7))
    groups = [save.background_group(index) for index in range(save.MAX_DCP_PARTS)]
    assert [_timeout(group) for group in groups] == [timedelta(seconds=7)] * save.MAX_DCP_PARTS


def test_a_new_process_group_gets_new_write_groups(one_rank: Path) -> None:
    ckpt_tools.training.prepare_save_groups(timedelta(seconds=7))
    first = save.background_group(0)
    dist.destroy_process_group()
    _start(one_rank / "rendezvous-2")
    second = save.background_group(0)
    assert second is not first
    dist.barrier(group=second)  # usable: the old one died with its process group
