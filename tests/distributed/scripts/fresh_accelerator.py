"""A fresh Accelerator per `train()` call in one torchrun process (the process group stays): scripts
that run several trainer runs per launch call `reset_accelerate()` between them."""

from __future__ import annotations

import os


def reset_accelerate() -> None:
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    for name in [n for n in os.environ if n.startswith(("ACCELERATE_", "FSDP_", "PARALLELISM_CONFIG_"))]:
        del os.environ[name]
