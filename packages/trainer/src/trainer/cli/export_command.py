"""`trainer export --policy.path=PATH --output_dir=DIR [--weights=model|ema] [--embodiment=NAME]`: a
checkpoint of ours as a model directory LeRobot 0.6.1's `ACTPolicy` / `SmolVLAPolicy.from_pretrained`
reads (evaluation/lerobot_export.py; docs/vla.md, "What moves between the two tools"); a policy trained
on several robots is exported for one (docs/datasets_at_scale.md)."""

from __future__ import annotations

from collections.abc import Sequence

from trainer.errors import ConfigError
from trainer.evaluation.lerobot_export import export_lerobot

USAGE = "usage: trainer export --policy.path=PATH --output_dir=DIR [--weights=model|ema] [--embodiment=NAME]"
_FLAGS = ("policy.path", "output_dir", "weights", "embodiment")


def run(args: Sequence[str]) -> str:
    """Export; returns the line the command prints (the directory and the files written)."""
    flags: dict[str, str] = {}
    for arg in args:
        name, equals, value = arg.removeprefix("--").partition("=")
        if not arg.startswith("--") or name not in _FLAGS or not equals:
            raise ConfigError(f"trainer export does not take {arg!r}: {USAGE.removeprefix('usage: ')}")
        flags[name] = value
    missing = [f"--{name}" for name in _FLAGS[:2] if not flags.get(name)]
    if missing:
        raise ConfigError(f"trainer export needs {' and '.join(missing)}: {USAGE.removeprefix('usage: ')}")
    names = export_lerobot(
        flags["policy.path"],
        flags["output_dir"],
        flags.get("weights") or None,
        flags.get("embodiment") or None,
    )
    return f"wrote {flags['output_dir']} for LeRobot: {', '.join(names)}"
