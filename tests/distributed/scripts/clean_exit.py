"""The one way a torchrun test script ends: leave the process group, flush, exit at once.

With FSDP2 on gloo a rank can abort at interpreter teardown after all its work succeeded; `os._exit`
right after `destroy_process_group` makes a successful script exit 0 every time. Scripts in this folder
import it by name (torchrun puts the script's folder on sys.path).
"""

from __future__ import annotations

import os
import sys

import torch.distributed as dist


def leave(barrier: bool = True) -> None:
    """Collective: call on all ranks, last."""
    if barrier:
        dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
