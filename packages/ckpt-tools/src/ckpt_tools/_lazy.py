"""Public names loaded on first use, for `ckpt_tools` and `ckpt_tools.training`: each keeps a table
of its names and the modules defining them, so importing it imports neither torch nor the modules it
names (the metadata commands answer in well under a second; `tests/ckpt/test_exported_members.py`)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping


def loader(package: str, exports: Mapping[str, str], modules: Mapping[str, str]) -> Callable[[str], object]:
    """The module `__getattr__` of `package`: a name of `exports` imported from the module the table
    names, a name of `modules` that module itself; each kept in `package`'s namespace once found (pdoc
    reads a module's `__dict__`), anything else an `AttributeError`."""

    def __getattr__(name: str) -> object:
        module = modules.get(name) or exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        imported = importlib.import_module(module)
        value = imported if name in modules else getattr(imported, name)
        setattr(sys.modules[package], name, value)  # found directly from now on
        return value

    return __getattr__
