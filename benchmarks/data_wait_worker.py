"""One rank of bench_data_wait.py: `trainer train` with the loop's batch stream timed.

The loop takes each step's batch from `trainer.data.pipeline.loader.batches`; this wraps that generator and
adds up the seconds the loop spends blocked in `next()` (the first batch, which waits for the workers
to start, is reported apart). Prints `RESULT {json}` with this rank's wait and the loop's seconds.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

from trainer.cli.parse import parse_config
from trainer.data.pipeline import loader
from trainer.engine.plan import train

_timed: dict[str, float] = {"first_s": 0.0, "wait_s": 0.0, "steps": 0}
_original = loader.batches


def _timed_batches(*args: Any, **kwargs: Any) -> Iterator[Any]:
    stream = _original(*args, **kwargs)
    start = time.perf_counter()
    while True:
        asked = time.perf_counter()
        try:
            batch = next(stream)
        except StopIteration:
            return
        waited = time.perf_counter() - asked
        if _timed["steps"] == 0:
            _timed["first_s"], start = waited, time.perf_counter()
        else:
            _timed["wait_s"] += waited
        _timed["steps"] += 1
        yield batch
        _timed["loop_s"] = time.perf_counter() - start


loader.batches = _timed_batches
train(parse_config(sys.argv[1:]))
print("RESULT " + json.dumps({"rank": int(os.environ.get("RANK", "0")), **_timed}), flush=True)
