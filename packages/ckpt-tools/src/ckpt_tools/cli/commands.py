"""The list of command modules the root registers. Add a module here to add a command."""

from __future__ import annotations

from types import ModuleType

from ckpt_tools.cli import merge_adapter

MODULES: list[ModuleType] = [merge_adapter]
