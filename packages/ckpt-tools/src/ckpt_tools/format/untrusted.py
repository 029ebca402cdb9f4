"""A checkpoint's bytes as untrusted input: the limits every reader holds, and how a hostile value may
appear in an error message.

A checkpoint may come from anywhere (a download, a shared bucket, a colleague's run), and `ckpt inspect`
or `ckpt verify` is exactly what a user runs on one they do not trust yet. So a value read from a file
appears in a message only through `describe`, which is bounded whatever the value (a self-referencing
list, a 10,000-digit integer, a megabyte string); JSON is parsed by `parse_json`, whose every failure
is one line; and the sizes below bound what a reader reads. Reading only regular files, and keeping
every file a checkpoint names inside its directory, is `storage.read_bytes` and `storage.contained`.
"""

from __future__ import annotations

import json
from typing import Any

from ckpt_tools.errors import CorruptCheckpointError

MAX_METADATA_BYTES = 512 << 20
"""A DCP `.metadata` pickle: 20,000 chunks take 2.4 MB, so this allows about four million."""
MAX_JSON_BYTES = 256 << 20
"""A JSON side file (`training_step.json`, configs, the index of a 10,000-shard model: a few MB)."""
MAX_POINTER_BYTES = 4096
"""The text form of `checkpoints/last`: a step name and a newline (a 2 GB file there is not read)."""
MAX_CONFIG_BYTES = 16 << 20
"""A config-sized JSON file (`train_config.json`, `config.json`, a scheduler's state): a few kB."""
MAX_INT = 2**63 - 1
"""Every size, offset and count in a checkpoint fits int64, as torch and safetensors store them."""


def parse_json(data: bytes, source: str) -> Any:
    """`json.loads` whose every failure is one CorruptCheckpointError line: invalid text, invalid
    UTF-8, nesting too deep for the parser, an integer over Python's digit limit."""
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CorruptCheckpointError(f"{source} is not valid JSON ({exc}); the file is damaged") from None
    except RecursionError:
        raise CorruptCheckpointError(
            f"{source} nests JSON too deeply to be a checkpoint file; the file is damaged"
        ) from None
    except ValueError as exc:  # "Exceeds the limit (4300 digits) for integer string conversion"
        raise CorruptCheckpointError(
            f"{source} holds a value JSON cannot carry here ({exc}); the file is damaged"
        ) from None


def describe(value: Any, width: int = 60) -> str:
    """A short description of an untrusted value for an error message, bounded whatever it is: a
    short string, a number or a short flat list as itself, anything else by its type and length."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        return str(int(value)) if abs(value) < 10**18 else f"a {value.bit_length()}-bit integer"
    if isinstance(value, float):
        return repr(float(value))
    if isinstance(value, str):
        text = str.__repr__(value[: width + 1])
        return text if len(value) <= width else f"{text[:-1]}...{text[-1]} ({len(value)} characters)"
    if isinstance(value, (list, tuple)) and len(value) <= 8 and all(_is_scalar(v) for v in value):
        inner = ", ".join(describe(v, 20) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
    if isinstance(value, (list, tuple, dict, set, frozenset, bytes, bytearray)):
        return f"a {type(value).__name__} of {len(value)} items"
    return f"a {type(value).__name__}"


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def is_count(value: Any) -> bool:
    """A non-negative integer within int64 (never a bool)."""
    return type(value) is int and 0 <= value <= MAX_INT


def check_like(saved: Any, live: Any, source: str) -> None:
    """Refuse a value read from a file (`saved`) unless it has the kind of value the object it goes
    into holds now (`live`: a scheduler's or optimizer's own state), so a string where a count belongs
    is one line before loading, not a TypeError at the first step. Dicts are compared key by key on
    the keys both hold (an older file may lack a key a newer torch added), lists item by item; an int
    must stay an int, a float may be any number; a live None or tensor takes anything."""
    if isinstance(live, dict):
        if not isinstance(saved, dict):
            raise CorruptCheckpointError(f"{source} is {describe(saved)}, expected an object")
        for key in live.keys() & saved.keys():
            check_like(saved[key], live[key], f"{source}: {key}")
    elif isinstance(live, (list, tuple)):
        if not isinstance(saved, list) or len(saved) != len(live):
            raise CorruptCheckpointError(f"{source} is {describe(saved)}, expected a list of {len(live)}")
        for index, (item, like) in enumerate(zip(saved, live, strict=True)):
            check_like(item, like, f"{source}[{index}]")
    else:
        kind = _kind(live)
        if kind is not None and _kind(saved) not in _ACCEPTS[kind]:
            raise CorruptCheckpointError(f"{source} is {describe(saved)}, expected a {kind}")


_ACCEPTS = {"bool": {"bool"}, "int": {"int"}, "float": {"int", "float"}, "string": {"string"}}


def _kind(value: Any) -> str | None:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    return "string" if isinstance(value, str) else None
