"""The task text as SmolVLA reads it: LeRobot's preprocessor steps, done inside the policy.

LeRobot appends a newline to the task and tokenizes it with the backbone's tokenizer (its defaults:
SmolVLM's tokenizer adds no special tokens), truncated to `tokenizer_max_length`, right-padded with the
pad token to the longest task of the batch (or to `tokenizer_max_length` with
`pad_language_to=max_length`); the mask is "not padding". A batch that already holds the tokens (LeRobot's
preprocessed `observation.language.*` keys) is used as it is; else the raw task comes as `task` (the
UTF-8 bytes the dataset gathers: data/dataset.py `TASK_KEY`).
"""

from __future__ import annotations

from typing import Any

import torch

from trainer.policies.common.vla.language import TOKEN_MASK_KEY, TOKENS_KEY, batch_tasks, tokenize
from trainer.policies.smolvla import backbone
from trainer.policies.smolvla.config import SmolVLAConfig


class Tokenizer:
    """The backbone's tokenizer with LeRobot's settings."""

    def __init__(self, config: SmolVLAConfig) -> None:
        self.config = config
        self.tokenizer: Any = backbone.load_tokenizer(config)

    def __call__(self, tasks: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens (B, L) int64, mask (B, L) bool) of the tasks, each followed by a newline."""
        texts = [task + "\n" for task in tasks]
        return tokenize(self.tokenizer, texts, self.config.tokenizer_max_length, self.config.pad_language_to)

    def batch_tokens(
        self, batch: dict[str, torch.Tensor], device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch's task tokens and mask: its own, else its `task` bytes tokenized."""
        if TOKENS_KEY in batch:
            return batch[TOKENS_KEY], batch[TOKEN_MASK_KEY].bool()
        tokens, mask = self(batch_tasks(batch, "SmolVLA"))
        return tokens.to(device), mask.to(device)

    def image_token_ids(self) -> tuple[int, int] | None:
        """(fake image token, global image token) ids, for add_image_special_tokens; None when the
        tokenizer has no such tokens."""
        ids = [self.tokenizer.convert_tokens_to_ids(t) for t in ("<fake_token_around_image>", "<global-img>")]
        unknown = self.tokenizer.unk_token_id
        if any(i is None or i == unknown for i in ids):
            return None
        return ids[0], ids[1]
