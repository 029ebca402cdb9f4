"""`ckpt push PATH REPO_ID`: publish a model directory to the Hub, or copy it to an fsspec target."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape

from ckpt_tools.cli.errors import run_guarded
from ckpt_tools.cli.output import Output, layout_line

if TYPE_CHECKING:
    from ckpt_tools.tools.publish import PublishResult


def push(
    path: str = typer.Argument(
        ..., help="Step directory, checkpoints/last, pretrained_model/ or converted model."
    ),
    repo_id: str = typer.Argument(
        ..., help="Hub repo id (namespace/name), or an fsspec URL / local path (s3://bucket/prefix, ./out)."
    ),
    private: bool = typer.Option(False, "--private", help="Create the Hub repo as private."),
    revision: str | None = typer.Option(None, "--revision", help="Branch to commit to (created if missing)."),
    commit_message: str | None = typer.Option(None, "--commit-message", help="Hub commit message."),
    weights: str | None = typer.Option(
        None, "--weights", help="model or ema (a run's --ema.enable average); default: ema when present."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Publish the weights, configs, processor files and a model card; never DCP shards or training state.

    The Hub token comes from HF_TOKEN or `hf auth login`; HF_ENDPOINT selects another Hub.
    """
    out = Output(as_json=as_json)

    def body() -> None:
        options = {
            "private": private,
            "revision": revision,
            "commit_message": commit_message,
            "weights": weights,
        }
        result = publish(out, str(path), repo_id, **options)
        layout = layout_line(str(path))
        if as_json:
            out.json({**result.to_dict(), "source_layout": layout})
        else:
            if layout:
                out.print(f"read {escape(layout)}")
            report(out, result)

    run_guarded(body, as_json=as_json)


def publish(out: Output, path: str, repo_id: str, **options: Any) -> PublishResult:
    """`publish_model`, with the client's upload bars shown only to a human at a terminal.

    Shared with `ckpt convert --push-to-hub`.
    """
    from ckpt_tools.tools.publish import publish_model

    if not out.interactive:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    return publish_model(path, repo_id, **options)


def report(out: Output, result: PublishResult) -> None:
    commit = f" (commit {result.commit_oid[:12]})" if result.commit_oid else ""
    out.print(f"published {len(result.files)} files to {escape(result.url)}{commit}")
    for name in result.files:
        out.print(f"  {escape(name)}")
    for note in result.notes:
        out.note(f"note: {escape(note)}")


def register(app: typer.Typer) -> None:
    app.command("push")(push)
