"""`ckpt diff A B`: tensors only on one side, shape and dtype changes, and value differences."""

from __future__ import annotations

import typer
from rich.markup import escape
from rich.table import Table

from ckpt_tools.cli.errors import EXIT_FAILURE, run_guarded
from ckpt_tools.cli.output import Output, layout_line
from ckpt_tools.reports.diff import EQUAL, DiffReport, TensorDiff, diff_checkpoints


def diff(
    a: str = typer.Argument(..., help="First checkpoint (step dir, last, model dir, .safetensors, DCP dir)."),
    b: str = typer.Argument(..., help="Second checkpoint."),
    atol: float = typer.Option(
        0.0, "--atol", min=0.0, help="Values within this absolute tolerance are equal."
    ),
    exit_code: bool = typer.Option(
        False, "--exit-code", help="Exit 1 when the checkpoints differ (like git diff)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON document instead of tables."),
) -> None:
    """Compare two checkpoints tensor by tensor, loading one tensor at a time."""
    out = Output(as_json=as_json)
    report = run_guarded(lambda: diff_checkpoints(str(a), str(b), atol=atol), as_json=as_json)
    if as_json:
        out.json(report.to_dict())
    else:
        _print(out, report)
    if exit_code and report.differs:
        raise typer.Exit(EXIT_FAILURE)


def _print(out: Output, report: DiffReport) -> None:
    for label, path in (("a", report.a), ("b", report.b)):
        layout = layout_line(path)
        out.print(f"{label}: {escape(path)}" + (f" ({escape(layout)})" if layout else ""))
    for label, names in (("only in a", report.only_a), ("only in b", report.only_b)):
        if names:
            out.print(f"{label} ({len(names)}): " + ", ".join(escape(n) for n in names))
    changed = [t for t in report.tensors if t.status != EQUAL]
    if changed:
        out.print(_table(changed))
    if report.differs:
        verdict = "DIFFERENT"
    else:
        verdict = "IDENTICAL" if report.atol == 0 else f"EQUAL within atol={report.atol:g}"
    out.print(
        f"{verdict}: {report.num_equal} of {len(report.tensors)} common tensors equal, {len(changed)} changed, "
        f"{len(report.only_a)} only in a, {len(report.only_b)} only in b"
    )


def _table(rows: list[TensorDiff]) -> Table:
    table = Table(title="changed tensors", title_justify="left")
    for column in ("name", "change", "a", "b", "max abs", "max rel"):
        table.add_column(column, justify="right" if column.startswith("max") else "left")
    for row in rows:
        table.add_row(
            escape(row.name),
            row.status,
            f"{row.dtype_a}{list(row.shape_a)}",
            f"{row.dtype_b}{list(row.shape_b)}",
            "-" if row.max_abs is None else f"{row.max_abs:.3g}",
            "-" if row.max_rel is None else f"{row.max_rel:.3g}",
        )
    return table


def register(app: typer.Typer) -> None:
    app.command("diff")(diff)
