"""The `--hook-NAME=A:B:...` flags of the fault-injection scripts (ops_train.py, resume_train.py).

A script maps hook flag names to functions that patch the trainer; `install_hooks` calls each one given,
with its values split on ':' (ints, floats, or strings such as a path), and returns the arguments left
for the trainer. Hook flags are ours, so the trainer never sees them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping


def _value(text: str) -> int | float | str:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def install_hooks(args: list[str], hooks: Mapping[str, Callable[..., None]]) -> list[str]:
    """Install every hook flag in `args`; the other arguments, in order."""
    rest = []
    for arg in args:
        name, _, value = arg.partition("=")
        if name in hooks:
            hooks[name](*[_value(part) for part in value.split(":") if value])
        else:
            rest.append(arg)
    return rest
