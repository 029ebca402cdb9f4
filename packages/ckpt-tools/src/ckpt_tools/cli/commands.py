"""The command table the root registers: command name -> the module that defines it. Add a line here
to add a command; the module exposes `register(app)`.

Modules are imported by name only when their command runs (or for `--help`, which lists them all), so
`ckpt inspect` imports inspect's code and not conversion's, publishing's or diff's.
"""

from __future__ import annotations

from collections.abc import Sequence

COMMANDS: dict[str, str] = {
    "convert": "ckpt_tools.cli.convert",
    "diff": "ckpt_tools.cli.diff",
    "inspect": "ckpt_tools.cli.inspect_command",
    "merge-adapter": "ckpt_tools.cli.merge_adapter",
    "push": "ckpt_tools.cli.push",
    "verify": "ckpt_tools.cli.verify",
}


def modules_for(argv: Sequence[str]) -> list[str]:
    """The modules to import for a command line: none for `--version`, the named command's alone, every
    one otherwise (no command, `--help`, a typo, which typer answers with the list)."""
    if list(argv[:1]) == ["--version"]:
        return []
    named = next((arg for arg in argv if not arg.startswith("-")), None)
    if named in COMMANDS:
        return [COMMANDS[named]]
    return list(COMMANDS.values())
