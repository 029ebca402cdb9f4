"""A run's outputs beside its checkpoints: metrics, the loss curve, experiment trackers, run files."""
