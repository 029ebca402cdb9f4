"""The model card (`README.md`) published with a model, generated from the run's own files.

Everything on the card comes from `training_step.json`, `train_config.json` / `config.json` and the
extras the trainer passes (the final loss), so a card never says more than the checkpoint knows. The
card holds no credentials: it is built from an allow-list of fields, never from the environment.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from ckpt_tools.errors import CheckpointError
from ckpt_tools.files import storage
from ckpt_tools.format import layout
from ckpt_tools.format.meta import LeRobotStep, TrainingStep, is_lerobot_step

logger = logging.getLogger(__name__)

LIBRARY_NAME = "ckpt-tools"

# Keys of `extra_card_info` with a place on the card; any other key becomes a row of the details table.
KNOWN_EXTRAS = ("policy_type", "dataset", "steps", "final_loss", "license", "tags")


@dataclass(frozen=True)
class CardInfo:
    """What the card says about the run; None means unknown, and the card leaves the row out."""

    policy_type: str | None = None
    dataset: str | None = None
    steps: int | None = None
    topology: str | None = None
    effective_batch_size: str | None = None
    mixed_precision: str | None = None
    final_loss: float | None = None
    license: str | None = None
    tags: tuple[str, ...] = ()
    adapter: bool = False
    extras: dict[str, str] = field(default_factory=dict)
    trained_with: str | None = None  # `the \`trainer\` package`, `LeRobot`; None when unknown


def gather_card_info(
    step_dir: str | None, model_dir: str, files: list[str], extra: dict[str, Any] | None = None
) -> CardInfo:
    """Read what the run's files say; `extra` (from the trainer) overrides them."""
    policy = _read_json(layout.join(model_dir, layout.POLICY_CONFIG))
    train = _read_json(layout.join(model_dir, layout.TRAIN_CONFIG))
    section = train.get("policy")
    train_policy: dict[str, Any] = section if isinstance(section, dict) else {}
    step, lerobot = _read_training_step(step_dir)
    extra = dict(extra or {})
    tags = extra.get("tags") or policy.get("tags") or train_policy.get("tags") or ()
    saved_step = step.step if step else lerobot.step if lerobot else None
    return CardInfo(
        policy_type=extra.get("policy_type") or policy.get("type") or train_policy.get("type"),
        dataset=extra.get("dataset") or _dataset_name(train.get("dataset")),
        steps=extra.get("steps") or (saved_step if saved_step is not None else train.get("steps")),
        topology=f"{step.topology.describe()} ({step.dp_world_size} ranks)" if step else None,
        effective_batch_size=_batch_formula(step) if step else _lerobot_batch(lerobot) if lerobot else None,
        mixed_precision=step.mixed_precision if step else None,
        final_loss=extra.get("final_loss"),
        license=extra.get("license") or policy.get("license") or train_policy.get("license"),
        tags=tuple(str(tag) for tag in tags),
        adapter=layout.ADAPTER_SAFETENSORS in files,
        extras={key: str(value) for key, value in extra.items() if key not in KNOWN_EXTRAS},
        trained_with="LeRobot" if lerobot else "the `trainer` package" if step or extra else None,
    )


def render_model_card(info: CardInfo, repo_id: str) -> str:
    """The card text: YAML front matter huggingface_hub's `ModelCard` accepts, then a short body."""
    from huggingface_hub import ModelCardData

    tags = [LIBRARY_NAME, *([info.policy_type] if info.policy_type else []), *info.tags]
    if info.adapter:
        tags.append("peft")
    data = ModelCardData(
        library_name=LIBRARY_NAME,
        license=info.license,
        tags=list(dict.fromkeys(tags)),
        datasets=[info.dataset] if info.dataset and _looks_like_hub_id(info.dataset) else None,
    )
    title = f"{info.policy_type} policy" if info.policy_type else "Policy"
    what = "a PEFT adapter (`adapter_model.safetensors`)" if info.adapter else "the full model weights"
    trained = f" trained with {info.trained_with}" if info.trained_with else ""
    sections = [
        f"# {title}",
        f"This repository holds {what} of a policy{trained}, published with ckpt-tools.",
        "## Training",
        _details_table(info),
        "## How to load",
        _load_snippet(repo_id, info.adapter),
    ]
    return f"---\n{data.to_yaml()}\n---\n\n" + "\n\n".join(sections) + "\n"


def _details_table(info: CardInfo) -> str:
    rows = [
        ("Policy type", info.policy_type),
        ("Dataset", info.dataset),
        ("Steps", info.steps),
        ("Topology", info.topology),
        ("Effective batch size", info.effective_batch_size),
        ("Mixed precision", info.mixed_precision),
        ("Final loss", f"{info.final_loss:.6g}" if info.final_loss is not None else None),
        *info.extras.items(),
    ]
    lines = ["| | |", "|---|---|"]
    lines += [f"| {name} | {_cell(value)} |" for name, value in rows if value is not None]
    return "\n".join(lines)


def _load_snippet(repo_id: str, adapter: bool) -> str:
    is_hub = not layout.is_url(repo_id) and not repo_id.startswith(("/", ".", "~"))
    fetch = (
        f'model_dir = snapshot_download("{repo_id}")'
        if is_hub
        else f'model_dir = "{repo_id}"  # any fsspec URL or local path'
    )
    lines = ["```python"]
    if is_hub:
        lines.append("from huggingface_hub import snapshot_download")
    lines += ["import ckpt_tools", "", fetch, "state_dict = ckpt_tools.load_model_state_dict(model_dir)"]
    if adapter:
        lines.append(
            "# the adapter's tensors under PEFT's names; or the base weights with the LoRA folded in:"
        )
        lines.append("merged = ckpt_tools.merge_adapter_dir(base_model_dir, model_dir)")
    else:
        lines.append("policy.load_state_dict(state_dict)  # a policy built from config.json")
    lines.append("```")
    return "\n".join(lines)


def _batch_formula(step: TrainingStep) -> str:
    return (
        f"{step.effective_batch_size} (batch_size {step.batch_size} x {step.dp_world_size} ranks "
        f"x {step.grad_accum_steps} accumulation steps)"
    )


def _dataset_name(dataset: Any) -> str | None:
    if isinstance(dataset, str):
        return dataset
    if isinstance(dataset, dict):
        for key in ("repo_id", "name", "type"):
            if isinstance(dataset.get(key), str):
                return dataset[key]
    return None


def _looks_like_hub_id(name: str) -> bool:
    return name.count("/") == 1 and not layout.is_url(name) and not name.startswith("/")


def _cell(value: Any) -> str:
    """A table cell: one line, and a `|` in a value must not split the row."""
    return " ".join(str(value).split()).replace("|", "\\|")


def _read_json(path: str) -> dict[str, Any]:
    if not storage.exists(path):
        return {}
    try:
        data = storage.read_json(path)
    except CheckpointError:
        logger.warning("%s is not valid JSON; the model card leaves its fields out", path)
        return {}
    return data if isinstance(data, dict) else {}


def _lerobot_batch(step: LeRobotStep) -> str:
    total = step.batch_size * step.dp_world_size
    return f"{total} (batch_size {step.batch_size} x {step.dp_world_size} processes)"


def _read_training_step(step_dir: str | None) -> tuple[TrainingStep | None, LeRobotStep | None]:
    """Ours, or LeRobot's (any release's, `format.meta.is_lerobot_step`), or neither."""
    if step_dir is None:
        return None, None
    path = layout.join(step_dir, layout.TRAINING_STATE_DIR, layout.TRAINING_STEP)
    if not storage.exists(path):
        return None, None
    data = _read_json(path)
    try:
        if is_lerobot_step(data):
            return None, LeRobotStep.from_dict(data, path)
        return TrainingStep.from_json(storage.read_bytes(path), source=path), None
    except CheckpointError as exc:
        logger.warning("model card leaves the run's topology out: %s", exc)
        return None, None
