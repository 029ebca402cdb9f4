"""`ckpt convert PATH`: DCP shards to safetensors (or `--to dcp` back), streaming, on CPU.

The body is one call to `ckpt_tools.tools.convert`; this file only parses flags and shows progress.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer
from rich.markup import escape

from ckpt_tools.cli.errors import run_guarded
from ckpt_tools.cli.output import Output, layout_line
from ckpt_tools.errors import UsageError
from ckpt_tools.format import layout

_TARGETS = ("safetensors", "dcp")


def convert(
    path: Annotated[
        str,
        typer.Argument(help="Step directory, checkpoints/last, pretrained_model/, or a DCP directory."),
    ],
    output: Annotated[
        str | None, typer.Option("--output", "-o", help="Output directory (default: beside the shards).")
    ] = None,
    dtype: Annotated[
        str | None,
        typer.Option(
            help="Cast floating tensors: bf16, fp16, fp32 or bfloat16, float16, float32 (integers untouched)."
        ),
    ] = None,
    max_shard_size: Annotated[
        str | None,
        typer.Option(
            "--max-shard-size",
            "--max_shard_size",
            help="Split into model-0000k-of-0000n.safetensors + index, e.g. 5GB.",
        ),
    ] = None,
    delete_dcp: Annotated[
        bool,
        typer.Option(
            "--delete-dcp",
            "--delete_dcp",
            help="Remove the DCP shards once the output is written and checked.",
        ),
    ] = False,
    push_to_hub: Annotated[
        str | None,
        typer.Option(
            "--push-to-hub",
            "--push_to_hub",
            help="Then publish the model to this Hub repo (or fsspec URL); --delete-dcp waits for both.",
        ),
    ] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace existing output files.")] = False,
    weights: Annotated[
        str,
        typer.Option(
            "--weights", help="model (default) or ema: the EMA shards (ema_dcp/) -> ema.safetensors."
        ),
    ] = "model",
    to: Annotated[
        str, typer.Option("--to", help="Target format: safetensors (default) or dcp.")
    ] = "safetensors",
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the result as JSON; no progress bar.")
    ] = False,
) -> None:
    """Convert DCP shards into model.safetensors (or a sharded set), with memory bounded by a buffer."""
    out = Output(as_json=as_json)

    def body() -> dict[str, Any]:
        from ckpt_tools.tools import convert as lib

        if to not in _TARGETS:
            raise typer.BadParameter(f"--to {to!r}: choose one of {', '.join(_TARGETS)}")
        if to == "dcp":
            if dtype or max_shard_size or delete_dcp or push_to_hub or weights != "model":
                raise UsageError(
                    "--dtype, --max-shard-size, --delete-dcp, --push-to-hub and --weights apply to DCP -> safetensors"
                )
            return lib.convert_safetensors_to_dcp(path, output, overwrite=overwrite).to_dict()
        if weights == "ema" and push_to_hub:
            raise UsageError("--push-to-hub publishes the model; push the step itself to publish its EMA")
        if delete_dcp and push_to_hub:  # deleted after the push: refuse a doomed output now
            lib.check_deletable_source(path, output)
        with _progress(out) as progress:
            result = lib.convert_dcp_to_safetensors(
                path,
                output,
                dtype=dtype,
                max_shard_size=max_shard_size,
                delete_dcp=delete_dcp,
                keep_source=bool(push_to_hub),  # deleted only once the publish succeeded
                overwrite=overwrite,
                progress=progress,
                weights=weights,
            )
        if push_to_hub:
            return _push_then_delete(out, result, output, push_to_hub, delete_dcp)
        return result.to_dict()

    source_layout = layout_line(str(path))  # before a --delete-dcp removes the source
    result = run_guarded(body, as_json=as_json)
    result = {**result, "source_layout": source_layout}
    if as_json:
        out.json(result)
    else:
        _report(out, result)


def _report(out: Output, result: dict[str, Any]) -> None:
    from ckpt_tools.cli.inspect_tables import human_bytes

    if result["source_layout"]:
        out.print(f"read {result['source_layout']}")
    for file in result["files"]:
        out.print(f"wrote {escape(file)}")
    if result["index_file"]:
        out.print(f"wrote {escape(result['index_file'])}")
    for file in result.get("companions", []):
        out.print(f"copied {escape(file)}")
    out.print(f"{result['num_tensors']} tensors, {human_bytes(result['total_bytes'])}")
    if result["deleted_source"]:
        out.note(f"removed {result['source']}")
    if result.get("published"):
        published = result["published"]
        out.print(f"published {len(published['files'])} files to {escape(published['url'])}")


def _push_then_delete(
    out: Output, result: Any, output: str | None, repo_id: str, delete_dcp: bool
) -> dict[str, Any]:
    """Publish the converted model; the DCP shards are deleted only once both conversion (written and
    checked) and publish succeeded, so a failed upload leaves the checkpoint as it was."""
    from ckpt_tools.cli.push import publish
    from ckpt_tools.tools import convert as lib

    model_dir = layout.parent(result.files[0])  # where the conversion wrote
    published = publish(out, model_dir, repo_id)
    if delete_dcp:
        lib.check_deletable_source(result.source, output)
        lib.delete_source(result.source)
    return dict(result.to_dict(), deleted_source=delete_dcp, published=published.to_dict())


@contextmanager
def _progress(out: Output) -> Iterator[Callable[[int, int], None] | None]:
    """A bytes / throughput / ETA bar on a terminal; nothing in --json mode or when piped."""
    if not out.interactive:
        yield None
        return
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    columns = (BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=out.err, transient=True) as bar:
        task = bar.add_task("convert", total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


def register(app: typer.Typer) -> None:
    app.command("convert")(convert)
