"""`trainer export --policy.path=PATH --output_dir=DIR [--weights=model|ema] [--embodiment=NAME]`: a
checkpoint of ours as a model directory LeRobot 0.6.1's `ACTPolicy` / `SmolVLAPolicy.from_pretrained`
reads (evaluation/lerobot_export.py; docs/vla.md, "What moves between the two tools"); a policy trained
on several robots is exported for one (docs/datasets_at_scale.md).

`--lerobot_step=true`: a step of ours as a step of LeRobot main's parallel engine, which its
`lerobot-train --resume=true` continues (evaluation/lerobot_step_export.py; docs/resume.md,
"Continuing a run in LeRobot"). It takes the model's weights and the whole run, so neither
`--weights` nor `--embodiment` goes with it."""

from __future__ import annotations

from collections.abc import Sequence

from trainer.errors import ConfigError
from trainer.evaluation.lerobot_export import export_lerobot
from trainer.evaluation.lerobot_step_export import export_lerobot_step

USAGE = (
    "usage: trainer export --policy.path=PATH --output_dir=DIR [--weights=model|ema] [--embodiment=NAME] "
    "[--lerobot_step=true]"
)
_FLAGS = ("policy.path", "output_dir", "weights", "embodiment", "lerobot_step")


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
    if _lerobot_step(flags):
        names = export_lerobot_step(flags["policy.path"], flags["output_dir"])
        return f"wrote {flags['output_dir']} as a LeRobot main step: {', '.join(names)}"
    names = export_lerobot(
        flags["policy.path"],
        flags["output_dir"],
        flags.get("weights") or None,
        flags.get("embodiment") or None,
    )
    return f"wrote {flags['output_dir']} for LeRobot: {', '.join(names)}"


def _lerobot_step(flags: dict[str, str]) -> bool:
    """`--lerobot_step`'s value; with it, the flags that choose among a model's weights are refused."""
    value = flags.get("lerobot_step", "false").lower()
    if value not in ("true", "false"):
        raise ConfigError(f"--lerobot_step={flags['lerobot_step']}: give true or false")
    others = [f"--{name}" for name in ("weights", "embodiment") if name in flags]
    if value == "true" and others:
        raise ConfigError(
            f"trainer export --lerobot_step=true writes the run's own weights for its own robot: drop {', '.join(others)}"
        )
    return value == "true"
