"""`ckpt inspect PATH`: what a checkpoint holds, from metadata only (no tensor data, no torch).

The tables are drawn by `inspect_tables` (rich), imported only when they are printed: `--json` output
needs neither rich nor fsspec, so a script asking for it pays for neither (benchmarks/bench_cli.py).
"""

from __future__ import annotations

import typer

from ckpt_tools.cli.errors import run_guarded
from ckpt_tools.cli.output import Output
from ckpt_tools.reports.describe import describe_checkpoint


def inspect(
    path: str = typer.Argument(..., help="Step directory, checkpoints/last, output_dir or model directory."),
    tensors: bool = typer.Option(False, "--tensors", help="List every tensor (name, shape, dtype, bytes)."),
    as_json: bool = typer.Option(
        False, "--json", help="Print a JSON document (everything) instead of tables."
    ),
) -> None:
    """Show step, topology, batch factorization, formats and per-module totals, reading metadata only."""
    out = Output(as_json=as_json)

    def body() -> None:
        description = describe_checkpoint(str(path))
        if as_json:
            out.json(description.to_dict())
        else:
            from ckpt_tools.cli.inspect_tables import print_description

            print_description(out, description, tensors)

    run_guarded(body, as_json=as_json)


def register(app: typer.Typer) -> None:
    app.command("inspect")(inspect)
