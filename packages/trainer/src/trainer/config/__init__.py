"""Configuration: plain dataclasses, parsed from dotted flags and JSON files by draccus."""
