"""`ckpt merge-adapter`: fold a LoRA adapter into its base weights, giving a plain model directory."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from ckpt_tools.cli.errors import run_guarded
from ckpt_tools.cli.output import Output, layout_line


def merge_adapter(
    adapter: Annotated[
        str, typer.Argument(help="Adapter checkpoint: step dir, last, or a pretrained_model/.")
    ],
    output: Annotated[
        Path,
        typer.Option(
            "--output",
            "-o",
            help="Directory for the merged model.safetensors, with the adapter's config.json and processors.",
        ),
    ],
    base: Annotated[
        str | None, typer.Option(help="Base model; default: base_model_name_or_path in adapter_config.json.")
    ] = None,
    overwrite: Annotated[
        bool, typer.Option(help="Replace an existing model.safetensors in --output.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Merge a LoRA adapter into its base model: W += alpha/r * B @ A, no peft needed."""
    out = Output(as_json=as_json)
    result = run_guarded(lambda: _merge(adapter, base, output, overwrite), as_json=as_json)
    if as_json:
        out.json(result)
    else:
        out.print(
            f"wrote {escape(str(result['path']))} ({result['tensors']} tensors, base {escape(str(result['base']))})"
        )
        if result["base_layout"]:
            out.print(f"base: {escape(str(result['base_layout']))}")


def _merge(adapter: str, base: str | None, output: Path, overwrite: bool) -> dict[str, object]:
    from safetensors.torch import save_file

    from ckpt_tools.errors import CheckpointError, OutputExistsError
    from ckpt_tools.files.locate import resolve_model_dir
    from ckpt_tools.format import layout
    from ckpt_tools.state.adapters import base_model_path, merge_adapter_dir
    from ckpt_tools.tools.companions import check_companions, companion_names, copy_companions

    base = base or base_model_path(adapter)
    if base is None:
        raise CheckpointError("the adapter does not record its base model; pass --base PATH")
    target = output / layout.MODEL_SAFETENSORS
    if target.exists() and not overwrite:
        raise OutputExistsError(f"{target} exists; pass --overwrite to replace it")
    model_dir = resolve_model_dir(adapter)[1]  # its config.json, processors, train_config.json
    extra = companion_names(model_dir, adapter=False)
    check_companions(model_dir, str(output), extra, overwrite)
    merged = merge_adapter_dir(base, adapter)
    output.mkdir(parents=True, exist_ok=True)
    partial = output / f"{layout.TMP_PREFIX}{layout.MODEL_SAFETENSORS}"
    save_file({k: v.contiguous() for k, v in merged.items()}, str(partial), metadata={"format": "pt"})
    os.replace(partial, target)
    copied = copy_companions(model_dir, str(output), extra)
    return {
        "path": str(target),
        "tensors": len(merged),
        "base": base,
        "base_layout": layout_line(base),
        "companions": copied,
    }


def register(app: typer.Typer) -> None:
    app.command("merge-adapter")(merge_adapter)
