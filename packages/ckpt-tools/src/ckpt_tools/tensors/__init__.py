"""Where torch enters: tensors to and from safetensors files and DCP directories."""
