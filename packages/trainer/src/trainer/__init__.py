"""The training engine. `trainer.load_policy(path)` turns any saved policy into one that acts."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"  # the distribution `ckpt-trainer` takes its version from here

__all__ = ["load_policy"]


def __getattr__(name: str) -> Any:
    """Lazy, so `import trainer` (and the CLI's start) does not import torch."""
    if name == "load_policy":
        from trainer.evaluation.inference import load_policy

        return load_policy
    raise AttributeError(f"module 'trainer' has no attribute {name!r}")
