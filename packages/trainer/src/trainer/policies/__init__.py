"""Built-in policies; importing this package registers their `--policy.type` names."""

from trainer.policies import act, diffusion, fastwam, mlp, pi, smolvla  # noqa: F401  (registration)
from trainer.policies.common.base import Policy, PolicyConfig, build_policy, register_import_path
from trainer.policies.common.pretrained import upgrade_policy_config

__all__ = ["Policy", "PolicyConfig", "build_policy", "register_import_path", "upgrade_policy_config"]
