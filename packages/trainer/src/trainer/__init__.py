"""The training engine. `trainer.load_policy(path)` turns any saved policy into one that acts;
`trainer.open_dataset(repo_id, root)` reads a LeRobotDataset, cameras decoded, as LeRobot does."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"  # the distribution `ckpt-trainer` takes its version from here

__all__ = ["load_policy", "open_dataset"]


def __getattr__(name: str) -> Any:
    """Lazy, so `import trainer` (and the CLI's start) does not import torch."""
    if name == "load_policy":
        from trainer.evaluation.inference import load_policy

        return load_policy
    if name == "open_dataset":
        from trainer.data.sources.lerobot import open_dataset

        return open_dataset
    raise AttributeError(f"module 'trainer' has no attribute {name!r}")
