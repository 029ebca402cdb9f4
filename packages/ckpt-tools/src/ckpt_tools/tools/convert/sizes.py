"""Size flags (`--max-shard-size`, the trainer's `--dataset.cache_size`): bytes, or a number with a
decimal (KB, MB...) or binary (KiB, MiB...) unit."""

from __future__ import annotations

import re

from ckpt_tools.errors import UsageError

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_UNITS |= {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(text: str | int, option: str = "--max-shard-size") -> int:
    """`5GB` -> 5_000_000_000 (decimal, as the Hub counts), `2GiB` -> 2**31, `1000` -> 1000 bytes;
    a malformed or non-positive size is one UsageError naming `option`."""
    if isinstance(text, int):
        return text
    match = _SIZE.match(text)
    if not match:
        raise UsageError(f"{option} {text!r} is not a size; use e.g. 5GB, 500MB or 2GiB", option=option)
    size = int(float(match.group(1)) * _UNITS[(match.group(2) or "B").upper()])
    if size <= 0:
        raise UsageError(f"{option} {text!r} must be positive", option=option)
    return size
