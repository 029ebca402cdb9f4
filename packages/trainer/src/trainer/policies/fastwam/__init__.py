"""LeRobot's FastWAM (`--policy.type=fastwam`): a Wan2.2 video DiT and an action DiT sharing joint
attention layer by layer, trained by flow matching on future video latents and action chunks.
`config.py` (LeRobot's flags and defaults, the experts' sizes), `modules.py` (the DiT blocks, the MoT
layer with its joint attention, embeddings and heads, in plain torch), `flow.py` (the schedules),
`frozen.py` (the UMT5 tokenizer and encoder and the Wan VAE, read where the config names them),
`policy.py` (the `Policy`), `lerobot.py` (LeRobot's config.json and processor schema). Importing it
registers the type; the policy's modules (and `transformers` / `diffusers`, the `fastwam` extra) are
imported only when one is built."""

from trainer.policies.fastwam.config import FastWAMConfig

__all__ = ["FastWAMConfig"]
