"""The embedded tasks: the pendulum sim and its demonstration dataset (no download needed)."""
