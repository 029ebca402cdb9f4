"""Bytes on local disk or in a bucket: storage access, the crash-safe step commit, locating steps, digests and the manifest, safetensors headers and the streaming writer. Torch-free."""
