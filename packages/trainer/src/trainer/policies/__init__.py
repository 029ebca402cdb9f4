"""Built-in policies; importing this package registers their `--policy.type` names."""

from trainer.policies import act, act_state, diffusion, fastwam, mlp, pi, smolvla  # noqa: F401  (registration)
from trainer.policies.act_state import upgrade_policy_config
from trainer.policies.base import Policy, PolicyConfig, build_policy, register_import_path

__all__ = ["Policy", "PolicyConfig", "build_policy", "register_import_path", "upgrade_policy_config"]
