"""Several trainer runs in one torchrun launch: a fresh Accelerator per run (the process group stays).
Scripts in this folder import it by name (torchrun puts the script's folder on sys.path)."""

from __future__ import annotations

import os


def reset_accelerate() -> None:
    """Forget accelerate's singleton state and the environment variables its last run set."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    for name in [n for n in os.environ if n.startswith(("ACCELERATE_", "FSDP_", "PARALLELISM_CONFIG_"))]:
        del os.environ[name]
