"""The embedded sim task, its demonstration dataset, the global-order sampler and the processors."""
