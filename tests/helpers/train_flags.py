"""The flags of a tiny `trainer train` run, shared by the in-process and the torchrun tests."""

from __future__ import annotations


def tiny_args(output_dir: str, cache: str, *extra: str) -> list[str]:
    """A few steps of a small policy, no evaluation: what every engine test needs."""
    return [
        f"--output_dir={output_dir}",
        f"--dataset.cache_dir={cache}",
        "--dataset.episodes=4",
        "--dataset.eval_episodes=0",
        "--steps=4",
        "--log_freq=2",
        "--save_freq=2",
        "--batch_size=8",
        *extra,
    ]
