"""The `ckpt` root command: it only registers the command modules."""

from __future__ import annotations

from collections.abc import Sequence

import typer

app = typer.Typer(
    name="ckpt",
    help="Inspect, verify, convert, compare and publish training checkpoints.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:
        from ckpt_tools._version import __version__

        print(f"ckpt {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Inspect, verify, convert, compare and publish training checkpoints."""
    # A callback keeps `ckpt` a command group even while only one command is registered.


def _register(argv: Sequence[str] = ()) -> None:
    """Import and register the modules of the commands this command line can run (commands.py;
    every command without one)."""
    import importlib

    from ckpt_tools.cli.commands import modules_for

    for name in modules_for(argv):
        importlib.import_module(name).register(app)


def main() -> None:
    import sys

    for stream in (sys.stdout, sys.stderr):  # a name from a checkpoint (a lone surrogate) never fails a print
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")
    _register(sys.argv[1:])
    app()
