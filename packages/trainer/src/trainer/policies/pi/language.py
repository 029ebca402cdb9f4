"""The prompt as LeRobot's pi0 / pi0.5 preprocessors build and tokenize it, done inside the policy.

pi0: the task followed by a newline (added when missing). pi0.5: the *normalized* state (before its
zero padding) discretized into 256 bins over [-1, 1] (`np.digitize` on float64 edges, minus one: below
-1 gives -1, 1 - 2/256 and above give 255), written as
`Task: <task, stripped, "_" and newlines as spaces>, State: <bins>;\nAction: `. Either is tokenized with
the PaliGemma tokenizer (BOS first, no EOS), right-padded with id 0 to `tokenizer_max_length`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from trainer.policies.common.vla.hub import TOKENIZER_FILES, import_transformers, load_pretrained
from trainer.policies.common.vla.language import TOKEN_MASK_KEY, TOKENS_KEY, batch_tasks, tokenize
from trainer.policies.pi.config import PI0Config

FLAG = "--policy.tokenizer_name"


def discretize_state(state: torch.Tensor) -> np.ndarray:
    """(B, n) normalized state -> (B, n) bins in -1..255, as openpi's PaligemmaTokenizer bins it."""
    return np.digitize(state.detach().cpu().numpy(), bins=np.linspace(-1, 1, 256 + 1)[:-1]) - 1


def pi05_prompts(tasks: list[str], state: torch.Tensor) -> list[str]:
    """pi0.5's prompt per sample: the task and the discretized state."""
    bins = discretize_state(state)
    return [
        f"Task: {task.strip().replace('_', ' ').replace(chr(10), ' ')}, State: {' '.join(map(str, row))};\nAction: "
        for task, row in zip(tasks, bins, strict=True)
    ]


class PiTokenizer:
    """The PaliGemma tokenizer with LeRobot's settings for pi0 / pi0.5."""

    def __init__(self, config: PI0Config) -> None:
        self.config = config
        auto = import_transformers("pi05" if config.pi05 else "pi0", "pi").AutoTokenizer
        needs = "pi0 and pi0.5 tokenize their prompt with PaliGemma's tokenizer: give its directory or Hub id"
        self.tokenizer: Any = load_pretrained(
            config.tokenizer_name, FLAG, "tokenizer", TOKENIZER_FILES, auto, needs
        )

    def prompts(self, tasks: list[str], state: torch.Tensor | None = None) -> list[str]:
        """The texts LeRobot's preprocessor hands its tokenizer (pi0.5 needs the normalized state)."""
        if self.config.pi05:
            if state is None:
                raise ValueError("pi05 writes the state into its prompt: the batch needs 'observation.state'")
            return pi05_prompts(tasks, state)
        return [task if task.endswith("\n") else task + "\n" for task in tasks]

    def __call__(
        self, tasks: list[str], state: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens (B, tokenizer_max_length) int64, mask bool) of the prompts."""
        return tokenize(
            self.tokenizer, self.prompts(tasks, state), self.config.tokenizer_max_length, "max_length"
        )

    def batch_tokens(
        self, batch: dict[str, torch.Tensor], state: torch.Tensor | None, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch's prompt tokens and mask: its own (LeRobot's preprocessed keys), else its `task`
        bytes tokenized."""
        if TOKENS_KEY in batch:
            return batch[TOKENS_KEY], batch[TOKEN_MASK_KEY].bool()
        tokens, mask = self(batch_tasks(batch, "pi05" if self.config.pi05 else "pi0"), state)
        return tokens.to(device), mask.to(device)
