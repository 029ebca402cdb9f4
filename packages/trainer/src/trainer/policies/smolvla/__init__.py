"""LeRobot's SmolVLA (`--policy.type=smolvla`): config, backbone, joint layers, flow matching, policy.

Importing this package registers the type; `transformers` (the `smolvla` extra) is imported only when
a SmolVLA is built."""

from trainer.policies.smolvla.config import SmolVLAConfig
from trainer.policies.smolvla.policy import SmolVLAPolicy

__all__ = ["SmolVLAConfig", "SmolVLAPolicy"]
