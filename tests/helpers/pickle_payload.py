"""A pickle payload whose effect is visible: tests of the restricted unpickler assert it never ran."""

from __future__ import annotations

import os
import pickle
from pathlib import Path


class TouchesFile:
    """Unpickling this with the standard unpickler runs `touch <path>`."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (f"touch {self.path}",))


def malicious_dcp_metadata(target: Path) -> bytes:
    """A DCP `.metadata` that creates `target` when torch's own unpickler reads it."""
    return pickle.dumps({"state_dict_metadata": TouchesFile(target)})
