"""The training engine. `trainer.load_policy(path)` turns any saved policy into one that acts;
`trainer.open_dataset(repo_id, root)` reads a LeRobotDataset, cameras decoded, as LeRobot does.

`import trainer` (and the CLI's start) does not import torch: the public names load lazily on first
use. Type checkers and editors read the `TYPE_CHECKING` imports below instead, so each public name has
its real signature; `tests/training/test_trainer_exports.py` keeps those imports, the lazy table and
`__all__` the same list.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"  # the distribution `ckpt-trainer` takes its version from here

# What mypy and editors read, never imported at run time; each name re-exported explicitly (`as`).
if TYPE_CHECKING:
    from trainer.data.sources.lerobot import open_dataset as open_dataset
    from trainer.evaluation.inference import load_policy as load_policy

# public name -> the module that defines it (mypy --strict checks these modules: noxfile.py typecheck)
_EXPORTS: dict[str, str] = {
    "load_policy": "trainer.evaluation.inference",
    "open_dataset": "trainer.data.sources.lerobot",
}

__all__ = sorted(_EXPORTS)


if not TYPE_CHECKING:  # to a type checker, a module __getattr__ would make every misspelt name `Any`

    def __getattr__(name: str) -> object:
        module = _EXPORTS.get(name)
        if module is None:
            raise AttributeError(f"module 'trainer' has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # found directly from now on
        return value
