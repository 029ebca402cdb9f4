"""Evaluation: sim rollouts, validation loss, and `load_policy` for pipelines outside training."""
