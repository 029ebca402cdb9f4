"""LeRobot's pi0 and pi0.5 (PaliGemma with a Gemma action expert, flow matching): config, backbone,
joint layers, flow model, prompt, weights, policy. Not registered as a `--policy.type` yet.

`transformers` (the `pi` extra) is imported only when a model is built."""

from trainer.policies.pi.config import Features, PI0Config, PI05Config
from trainer.policies.pi.layers import JointLayer
from trainer.policies.pi.policy import PiPolicy

__all__ = ["Features", "JointLayer", "PI0Config", "PI05Config", "PiPolicy"]
