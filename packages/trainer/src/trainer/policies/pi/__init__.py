"""LeRobot's pi0 and pi0.5 (`--policy.type=pi0`, `--policy.type=pi05`): PaliGemma with a Gemma action
expert, trained by flow matching. `config.py` (LeRobot's flags and defaults, the sizes), `backbone.py`
(SigLIP, the projector, the embeddings), `layers.py` (the decoder layers, the FSDP units, paired by layer),
`model.py` (tokens, masks, loss, sampler), `language.py` (the prompt), `weights.py` (LeRobot's names),
`policy.py` (the `Policy`). Importing it registers both types; `transformers` (the `pi` extra) is
imported only when a model is built."""

from trainer.policies.pi.config import Features, PI0Config, PI05Config
from trainer.policies.pi.layers import JointLayer
from trainer.policies.pi.policy import PI0Policy, PI05Policy, PiPolicy

__all__ = ["Features", "JointLayer", "PI0Config", "PI0Policy", "PI05Config", "PI05Policy", "PiPolicy"]
