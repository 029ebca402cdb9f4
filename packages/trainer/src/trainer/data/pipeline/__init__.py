"""The input pipeline: the global-order sampler, the DataLoader, augmentation, processors, renaming."""
