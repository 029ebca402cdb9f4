"""ACT (Action Chunking with Transformers) as LeRobot builds it, with LeRobot's flag names and defaults.

Per camera, the frames go through a ResNet trunk (policies/common/resnet.py; one trunk shared by all cameras,
as in LeRobot), a 1x1 convolution to `dim_model`, and 2-D sinusoidal position embeddings; each feature
map cell is a token. The transformer encoder reads [latent token, state token, camera tokens]; the
decoder turns `chunk_size` learned positions into a chunk of actions (L1 loss, padded steps masked).

In training with `use_vae`, a CVAE encoder reads [CLS, state, the target action chunk] and gives the
latent's mean and log-variance; the loss adds `kl_weight` x KL divergence to a unit Gaussian. At run
time the latent is zero. `select_action` runs the model once per `n_action_steps` actions (an action
queue), or every step with `temporal_ensemble_coeff` (a weighted mean of every chunk's prediction for
the current step, weights exp(-coeff * i), i = 0 the oldest).

Attention is our own module with separate q/k/v/out projections (LeRobot uses `nn.MultiheadAttention`,
whose fused input projection LoRA cannot target); the layer arithmetic (post-norm by default,
`pre_norm`, positions added to queries and keys only) is LeRobot's. The transformer layers and the
trunk's stages are the FSDP wrap units.

The folder: `config.py` (ACTConfig: LeRobot's flags and defaults, its training preset), `modules.py`
(attention, encoder and decoder layers, sinusoidal position embeddings, temporal ensembling),
`policy.py` (ACTPolicy), `lerobot.py` (LeRobot's config.json schema and tensor names both ways) and
`state.py` (`act_state`, the state-only ACT of earlier releases).
"""

from trainer.policies.act import state  # noqa: F401  (registers act_state)
from trainer.policies.act.config import ACTConfig
from trainer.policies.act.modules import TemporalEnsembler, sinusoidal_1d, sinusoidal_2d
from trainer.policies.act.policy import ACTPolicy

__all__ = ["ACTConfig", "ACTPolicy", "TemporalEnsembler", "sinusoidal_1d", "sinusoidal_2d"]
