"""What several policies build from: the `Policy` interface and `build_policy` (base.py), `--policy.path`
(pretrained.py), the ResNet trunk, the vocabulary-parallel embedding, activation checkpointing, and
what LeRobot's VLA policies compute alike (vla/)."""
