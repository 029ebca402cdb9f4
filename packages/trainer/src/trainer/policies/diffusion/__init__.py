"""LeRobot 0.6.1's Diffusion Policy in plain torch (diffusers for the noise schedulers): `config.py` (its
flags and defaults), `vision.py` (the camera encoders), `unet.py` (the conditional 1-D U-Net), `model.py`
(conditioning, loss, sampling), `queues.py` (select_action's observation and action queues),
`policy.py` (`--policy.type=diffusion`: the `Policy` around the model). Importing it registers the type;
diffusers (the `diffusion` extra) is imported only when a model is built."""

from trainer.policies.diffusion.config import DiffusionConfig, DiffusionFeatures
from trainer.policies.diffusion.model import DiffusionModel
from trainer.policies.diffusion.policy import DiffusionPolicy
from trainer.policies.diffusion.queues import ActionQueue

__all__ = ["ActionQueue", "DiffusionConfig", "DiffusionFeatures", "DiffusionModel", "DiffusionPolicy"]
