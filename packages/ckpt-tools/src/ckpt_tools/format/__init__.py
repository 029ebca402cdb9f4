"""The on-disk format itself: names, the training_step.json schema, dtype names, the limits on untrusted bytes. Torch-free."""
