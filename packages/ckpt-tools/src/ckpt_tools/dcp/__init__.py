"""PyTorch DCP directories read without torch: the restricted unpickler for `.metadata`, the chunk index, chunk tiling."""
