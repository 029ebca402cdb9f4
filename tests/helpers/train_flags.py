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


# LeRobot's ACT narrowed to test sizes (its defaults are a 512-wide transformer and a 100-action chunk),
# trained from scratch: the ImageNet trunk weights it names by default cannot be downloaded here.
TINY_LEROBOT_ACT = (
    "--policy.dim_model=16",
    "--policy.n_heads=2",
    "--policy.dim_feedforward=32",
    "--policy.n_encoder_layers=1",
    "--policy.n_vae_encoder_layers=1",
    "--policy.latent_dim=4",
    "--policy.chunk_size=4",
    "--policy.n_action_steps=2",
    "--policy.pretrained_backbone_weights=null",
)
