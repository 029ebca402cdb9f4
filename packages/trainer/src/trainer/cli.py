"""`trainer train --flag=value ...`: parse the config, run, and exit cleanly on every rank.

Launch with `python -m trainer.cli train`, `torchrun ... $(which trainer) train` or `accelerate launch`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

USAGE = "usage: trainer train [--config_path=FILE] [--policy.type=act|mlp|module:Class] [--flag=value ...]"


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["train"] and args[1:2] in (["-h"], ["--help"]):
        from trainer.config.flags import help_text

        print(f"{USAGE}\n\nFlags (default after =; docs/training.md explains them):\n{help_text()}")
        raise SystemExit(0)
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
