"""MLP: a plain behaviour-cloning baseline that maps an observation to one action (`config.py`,
`policy.py`); it has no LeRobot form."""

from trainer.policies.mlp.config import MLPConfig
from trainer.policies.mlp.policy import MLPBlock, MLPPolicy

__all__ = ["MLPBlock", "MLPConfig", "MLPPolicy"]
