"""Demonstrations in, in rooms: `format/` (the LeRobotDataset v3.0 files), `pipeline/` (sampler, loader,
augmentation, processors), `embedded/` (the sim tasks and their dataset), `sources/` (where a run's
dataset comes from). Importing this package registers the built-in `--dataset.type` names."""

from trainer.data.embedded import pendulum  # noqa: F401  (registration)
from trainer.data.sources import lerobot, mixture  # noqa: F401  (registration)
