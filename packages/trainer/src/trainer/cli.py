"""`trainer train --flag=value ...`: parse the config, run, and exit cleanly on every rank.

Launch with `python -m trainer.cli train`, `torchrun ... $(which trainer) train` or `accelerate launch`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

USAGE = "usage: trainer train [--config_path=FILE] [--policy.type=act|mlp|module:Class] [--flag=value ...]"
HELP_FLAGS = ("-h", "--help")


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["-h"], ["--help"]):
        print(
            f"{USAGE}\n\nFlags: trainer train --help (trainer train --policy.type=T --help for one policy)."
        )
        raise SystemExit(0)
    if args[:1] == ["--version"]:
        from importlib.metadata import version

        print(f"trainer {version('trainer')}")
        raise SystemExit(0)
    if args[:1] == ["train"] and any(arg in HELP_FLAGS for arg in args[1:]):
        _print_help(args[1:])
    if not args or args[0] != "train":
        print(USAGE + "\nFlags: trainer train --help, or docs/training.md.", file=sys.stderr)
        raise SystemExit(2)
    from trainer.config.parse import parse_config
    from trainer.errors import ConfigError
    from trainer.loop import train

    try:
        train(parse_config(args[1:]))
    except ConfigError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        _exit(1)
    _exit(0)


def _print_help(args: list[str]) -> None:
    """The generated flag table on stdout, for the `--policy.type` given (all built-in types if none)."""
    from trainer.config.flags import help_text
    from trainer.policies.base import known_types, register_import_path

    types = [arg.partition("=")[2] for arg in args if arg.startswith("--policy.type=")]
    policy_type = types[-1] if types else None
    if policy_type is not None:
        register_import_path(policy_type)
        if policy_type not in known_types():
            print(
                f"error: --policy.type={policy_type!r} is unknown: choose one of {', '.join(known_types())}",
                file=sys.stderr,
            )
            raise SystemExit(1)
    print(f"{USAGE}\n\nFlags (default after =; docs/training.md explains them):\n{help_text(policy_type)}")
    raise SystemExit(0)


def _exit(code: int) -> None:
    """Leave the process group and exit at once.

    With FSDP2 on gloo a rank can abort at interpreter shutdown after all work succeeded; exiting with
    os._exit right after destroy_process_group makes a successful run exit 0 every time.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    if dist.is_available() and "WORLD_SIZE" in os.environ:
        os._exit(code)
    raise SystemExit(code)


if __name__ == "__main__":
    main()
