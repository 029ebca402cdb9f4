"""A toy policy that uses every hook of the policy contract, observation history included: the
"add a policy" page (docs/add_a_policy.md) follows it. It is a folder plus one registration line
(`register_subclass` below); a run names it with `--policy.type=toy`, after importing this package
(or as `--policy.type=helpers.toy_policy:ToyConfig` without the import)."""

from helpers.toy_policy.config import ToyConfig
from helpers.toy_policy.policy import ToyPolicy

__all__ = ["ToyConfig", "ToyPolicy"]
