"""The embedded sim task, its demonstration dataset, LeRobotDatasets, the global-order sampler and the
processors. Importing this package registers the built-in `--dataset.type` names."""

from trainer.data import lerobot, pendulum  # noqa: F401  (registration)
