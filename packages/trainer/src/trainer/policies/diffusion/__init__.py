"""LeRobot 0.6.1's Diffusion Policy in plain torch (diffusers for the noise schedulers): `config.py` (its
flags and defaults), `vision.py` (the camera encoders), `unet.py` (the conditional 1-D U-Net), `model.py`
(conditioning, loss, sampling), `queues.py` (select_action's observation and action queues)."""

from trainer.policies.diffusion.config import DiffusionConfig, DiffusionFeatures
from trainer.policies.diffusion.model import DiffusionModel
from trainer.policies.diffusion.queues import ActionQueue

__all__ = ["ActionQueue", "DiffusionConfig", "DiffusionFeatures", "DiffusionModel"]
