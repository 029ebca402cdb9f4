"""Topology resolution, the accelerate factory and the FSDP wrap plan."""
