"""The fields of `adapter_config.json` a LoRA merge reads, checked before any arithmetic.

A string `lora_alpha`, a rank of 0 or a pattern that is not a regular expression would otherwise
surface as a TypeError, ZeroDivisionError or re.error from the middle of a merge; `ckpt verify` runs
the same check, so it does not say OK to an adapter that cannot merge. Torch-free on purpose.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from ckpt_tools.format.untrusted import describe

MAX_RANK = 2**31 - 1


def pattern_regex(pattern: str) -> str:
    """peft matches `rank_pattern`/`alpha_pattern` keys as regexes against the end of a module name."""
    return rf"(.*\.)?({pattern})$"


def adapter_config_problems(config: Any, source: str = "adapter_config.json") -> list[str]:
    """One line per merge field that is unusable: `lora_alpha` and `alpha_pattern` values must be
    finite numbers, `r` and `rank_pattern` values positive integers, pattern keys regexes."""
    if not isinstance(config, Mapping):
        return [f"{source} must hold an object, not {describe(config)}"]
    problems = []
    if "lora_alpha" in config and not _is_number(config["lora_alpha"]):
        problems.append(f"{source}: lora_alpha is {describe(config['lora_alpha'])}, not a finite number")
    if "r" in config and not is_rank(config["r"]):
        problems.append(f"{source}: r is {describe(config['r'])}, not a positive integer rank")
    for field, valid, kind in (
        ("rank_pattern", is_rank, "a positive integer rank"),
        ("alpha_pattern", _is_number, "a finite number"),
    ):
        patterns = config.get(field) or {}
        if not isinstance(patterns, Mapping):
            problems.append(f"{source}: {field} is {describe(patterns)}, not an object")
            continue
        for pattern, value in patterns.items():
            if not _is_regex(pattern):
                problems.append(f"{source}: {field} key {describe(pattern)} is not a regular expression")
            elif not valid(value):
                problems.append(f"{source}: {field}[{describe(pattern)}] is {describe(value)}, not {kind}")
    return problems


def is_rank(value: Any) -> bool:
    return type(value) is int and 0 < value <= MAX_RANK


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_regex(pattern: Any) -> bool:
    if not isinstance(pattern, str) or len(pattern) > 1000:
        return False
    try:
        re.compile(pattern_regex(pattern))
    except re.error:
        return False
    return True
