"""`ckpt verify PATH`: exit 0 with an OK summary, or exit 1 listing every problem found."""

from __future__ import annotations

import typer
from rich.markup import escape

from ckpt_tools.cli.errors import EXIT_FAILURE, run_guarded
from ckpt_tools.cli.output import Output, layout_line
from ckpt_tools.reports.verify import VerifyReport, verify_checkpoint


def verify(
    path: str = typer.Argument(..., help="Step directory, checkpoints/last, output_dir or model directory."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON document instead of text."),
    deep: bool = typer.Option(
        False, "--deep", help="Also re-hash every file the save's manifest lists (reads all bytes)."
    ),
) -> None:
    """Check that a checkpoint is complete and self-consistent (metadata only, no tensor data; with
    --deep, every byte against the sha256 digests in the step's manifest)."""
    out = Output(as_json=as_json)
    report = run_guarded(lambda: verify_checkpoint(str(path), deep=deep), as_json=as_json)
    layout = layout_line(str(path))
    if as_json:
        out.json({**report.to_dict(), "layout": layout})
    else:
        _print(out, report, layout)
    if not report.ok:
        raise typer.Exit(EXIT_FAILURE)


def _print(out: Output, report: VerifyReport, layout: str) -> None:
    where = f"{escape(report.path)}, {escape(layout)}" if layout else escape(report.path)
    if report.ok:
        out.print(f"OK: {where} ({len(report.checked)} checks passed)")
        return
    out.print(f"FAILED: {where}: {len(report.problems)} problem(s)")
    for problem in report.problems:
        out.print(f"  - {escape(problem)}")


def register(app: typer.Typer) -> None:
    app.command("verify")(verify)
