"""The task text as LeRobot's tokenizer step gives it to a VLA policy: token ids and a "not padding"
mask under `observation.language.*`, right-padded, truncated to the policy's maximum length."""

from __future__ import annotations

from typing import Any

import torch

from trainer.data.dataset import TASK_KEY, task_texts

TOKENS_KEY = "observation.language.tokens"
TOKEN_MASK_KEY = "observation.language.attention_mask"


def tokenize(
    tokenizer: Any, texts: list[str], max_length: int, padding: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids (B, L) int64, mask (B, L) bool): LeRobot's TokenizerProcessorStep call (truncation on,
    right padding; `padding` "longest" or "max_length")."""
    encoded = tokenizer(
        texts,
        max_length=max_length,
        truncation=True,
        padding=padding,
        padding_side="right",
        return_tensors="pt",
    )
    return encoded["input_ids"].long(), encoded["attention_mask"].bool()


def batch_tasks(batch: dict[str, torch.Tensor], policy_type: str) -> list[str]:
    """The raw task texts of a batch (its `task` bytes); one line when it has none."""
    if TASK_KEY not in batch:
        raise ValueError(f"the batch holds no task: {policy_type} needs {TOKENS_KEY!r} or {TASK_KEY!r}")
    return task_texts(batch[TASK_KEY])
