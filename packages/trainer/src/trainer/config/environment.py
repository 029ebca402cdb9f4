"""LeRobot's environment evaluation (`--env.*`, `--env_eval_freq`, `--eval.*`): not built here yet.

lerobot-train rolls the policy out in a simulated environment every `--env_eval_freq` steps when
`--env.type` names one. This trainer has no environment evaluation during training: the `--eval.*`
group is accepted with LeRobot's defaults (what a LeRobot command carries without asking for an
evaluation), and a value that configures one is refused in one line (cli/lerobot_flags.py refuses
`--env.*` itself). A trained policy is scored afterwards by `trainer eval`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from trainer.errors import ConfigError

NOT_BUILT = (
    "environment evaluation (--env.type) is not built yet: train without it and score the trained policy "
    "with `trainer eval --policy.path=OUTPUT_DIR/checkpoints/last` (rollouts on a simulated task's "
    "dataset, offline scores on a LeRobotDataset; docs/training.md, Evaluation)"
)


@dataclass
class EnvEvalConfig:
    """LeRobot's `--eval.*` (its EvalConfig): accepted with LeRobot's defaults only, since they
    configure the environment evaluation this trainer does not run."""

    n_episodes: int = 50
    """LeRobot's rollouts per environment evaluation (only LeRobot's default is accepted)."""
    batch_size: int = 0
    """LeRobot's parallel environments (0: auto; only LeRobot's default is accepted)."""
    use_async_envs: bool = True
    """LeRobot's asynchronous vector environments (only LeRobot's default is accepted)."""
    recording: bool = False
    """LeRobot's recording of evaluation rollouts (only LeRobot's default is accepted)."""
    recording_repo_id: str | None = None
    """LeRobot's Hub repo of recorded rollouts (only LeRobot's default is accepted)."""
    recording_private: bool = False
    """LeRobot's privacy of that repo (only LeRobot's default is accepted)."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value != field.default:
                shown = str(value).lower() if isinstance(value, bool) else value
                raise ConfigError(f"--eval.{field.name}={shown} configures LeRobot's {NOT_BUILT}")
