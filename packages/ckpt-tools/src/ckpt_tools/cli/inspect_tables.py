"""`ckpt inspect`'s human output: the summary grid and the module or tensor table (rich), kept apart
from the command so that `--json` never imports rich."""

from __future__ import annotations

import math

from rich.markup import escape
from rich.table import Table

from ckpt_tools.cli.output import Output
from ckpt_tools.reports.describe import CheckpointDescription, TensorGroup, batch_factorization

_UNITS = ("B", "KB", "MB", "GB", "TB", "PB")


def human_bytes(count: int) -> str:
    """Decimal units (`1.5 GB`), as the Hub and `--max-shard-size` count them."""
    value = float(count)
    for unit in _UNITS:
        if value < 1000 or unit == _UNITS[-1]:
            return f"{count} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def module_totals(group: TensorGroup) -> list[tuple[str, int, int, int]]:
    """(module, tensors, parameters, bytes) per top-level module of the policy, in stored order. A PEFT
    model's `base_model.model.` prefix is skipped, so its modules are the policy's own."""
    totals: dict[str, list[int]] = {}
    for tensor in group.tensors:
        name = tensor.name.removeprefix("base_model.model.")
        module = name.split(".", 1)[0] if "." in name else "(root)"
        entry = totals.setdefault(module, [0, 0, 0])
        entry[0] += 1
        entry[1] += math.prod(tensor.shape)
        entry[2] += tensor.nbytes
    return [(module, *values) for module, values in totals.items()]  # type: ignore[misc]


def print_description(out: Output, description: CheckpointDescription, tensors: bool) -> None:
    """The summary grid, one line per weight set, then the preferred weights' modules (or tensors)."""
    summary = Table.grid(padding=(0, 2))
    summary.add_column(style="bold")
    summary.add_column()
    summary.add_row("checkpoint", escape(description.path))
    summary.add_row("layout", escape(description.layout_line))
    step = description.training_step
    if description.lerobot_step is not None:
        lerobot = description.lerobot_step
        summary.add_row("step", str(lerobot.step))
        if lerobot.parallelism is not None:
            summary.add_row("parallelism", lerobot.parallelism.describe())
        summary.add_row("batch", f"{batch_factorization(lerobot)}  (batch_size x dp_world_size x grad_accum)")
    elif step is None:
        summary.add_row("training state", "none")
    else:
        summary.add_row("step", str(step.step))
        summary.add_row("topology", step.topology.describe())
        summary.add_row("batch", f"{batch_factorization(step)}  (batch_size x dp_world_size x grad_accum)")
        summary.add_row("mixed precision", step.mixed_precision)
        summary.add_row("checkpoint format", step.checkpoint_format)
    summary.add_row("present", ", ".join(description.formats) or "no tensor files")
    out.print(summary)
    root = (description.step_dir or description.model_dir).rstrip("/") + "/"
    for group in description.groups:
        note = f", {group.objects} non-tensor entries" if group.objects else ""
        out.print(
            f"[bold]{group.label}[/bold] {escape(group.path.removeprefix(root))}: {len(group.tensors)} tensors, "
            f"{human_bytes(group.total_bytes)}{note}"
        )
    weights = description.weights
    if weights is not None:
        out.print(_tensor_table(weights) if tensors else _module_table(weights))
        if not tensors:
            out.note("every tensor: ckpt inspect --tensors")


def _module_table(group: TensorGroup) -> Table:
    table = Table(title=f"modules ({group.label})", title_justify="left")
    table.add_column("module")
    for column in ("tensors", "parameters", "bytes"):
        table.add_column(column, justify="right")
    for module, count, params, nbytes in module_totals(group):
        table.add_row(escape(module), str(count), f"{params:,}", human_bytes(nbytes))
    table.add_section()
    params = sum(math.prod(t.shape) for t in group.tensors)
    table.add_row("total", str(len(group.tensors)), f"{params:,}", human_bytes(group.total_bytes))
    return table


def _tensor_table(group: TensorGroup) -> Table:
    table = Table(title=f"tensors ({group.label})", title_justify="left")
    table.add_column("name")
    table.add_column("shape")
    table.add_column("dtype")
    table.add_column("bytes", justify="right")
    for tensor in group.tensors:
        shape = "(" + ", ".join(str(d) for d in tensor.shape) + ")"
        table.add_row(escape(tensor.name), shape, tensor.dtype, human_bytes(tensor.nbytes))
    table.add_section()
    table.add_row(f"total: {len(group.tensors)} tensors", "", "", human_bytes(group.total_bytes))
    return table
