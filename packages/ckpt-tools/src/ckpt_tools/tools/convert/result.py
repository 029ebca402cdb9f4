"""What a conversion reports, and the progress callback it calls while writing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Progress = Callable[[int, int], None]
"""Called as `progress(bytes_written_so_far, total_bytes)` while a conversion writes (a progress bar)."""


@dataclass(frozen=True)
class ConversionResult:
    """What a conversion wrote. `files` are final paths; `index_file` is set for sharded output."""

    source: str
    files: tuple[str, ...]
    index_file: str | None
    num_tensors: int
    total_bytes: int
    dtype: str | None
    deleted_source: bool
    companions: tuple[str, ...] = ()  # configs and processors copied into a separate output directory

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__, files=list(self.files), companions=list(self.companions))
