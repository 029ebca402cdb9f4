"""The list of command modules the root registers. Add a module here to add a command."""

from __future__ import annotations

from types import ModuleType

from ckpt_tools.cli import convert, diff, inspect_command, merge_adapter, push, verify

MODULES: list[ModuleType] = [convert, diff, inspect_command, merge_adapter, push, verify]
