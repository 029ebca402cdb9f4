"""`trainer train --flag=value ...`: parse the config, run, and exit cleanly on every rank.

Launch with `python -m trainer.cli train`, `torchrun ... $(which trainer) train` or `accelerate launch`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

USAGE = (
    "usage: trainer train [--config_path=FILE] [--policy.type=act|mlp|module:Class] [--flag=value ...]\n"
    "       trainer eval --policy.path=PATH [--dataset.root=DIR --dataset.episodes=[...]] [--json]\n"
    "       trainer eval --policy.path=PATH --env.type=pusht|aloha|pendulum|gym [--eval.n_episodes=N ...]\n"
    "       trainer eval --watch OUTPUT_DIR   (the evaluator: scores a run's checkpoints as they land)\n"
    "       trainer dataset info|show --dataset.root=DIR [--json | --episode=N]\n"
    "       trainer export --policy.path=PATH --output_dir=DIR [--weights=model|ema] [--embodiment=NAME]"
    "   (for LeRobot)\n"
    "       trainer lighthouse [--bind=HOST:PORT] [--min_replicas=N]   (torchft's, for --fault_tolerance.*)"
)
HELP_FLAGS = ("-h", "--help")


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["-h"], ["--help"]):
        print(
            f"{USAGE}\n\nFlags: trainer train --help (trainer train --policy.type=T --help for one policy)."
        )
        raise SystemExit(0)
    if args[:1] == ["--version"]:
        from trainer import __version__

        print(f"trainer {__version__}")
        raise SystemExit(0)
    if args[:1] == ["train"] and any(arg in HELP_FLAGS for arg in args[1:]):
        _print_help(args[1:])
    if args[:1] == ["eval"] and any(arg in HELP_FLAGS for arg in args[1:]):
        from trainer.cli.eval_command import HELP

        print(HELP)
        raise SystemExit(0)
    if not args or args[0] not in ("train", "eval", "dataset", "export", "lighthouse"):
        print(USAGE + "\nFlags: trainer train --help, or docs/training.md.", file=sys.stderr)
        raise SystemExit(2)
    from trainer.distributed.interrupt import Interrupted
    from trainer.errors import TrainerError

    try:
        if args[0] == "eval":
            _eval(args[1:])
        elif args[0] == "dataset":
            from trainer.cli.dataset_command import run as dataset_command

            print(dataset_command(args[1:]))
        elif args[0] == "export":
            from trainer.cli.export_command import run as export_command

            print(export_command(args[1:]))
        elif args[0] == "lighthouse":
            from trainer.cli.lighthouse_command import run as lighthouse_command

            lighthouse_command(args[1:])
        else:
            from trainer.cli.parse import parse_config
            from trainer.engine.plan import train

            train(parse_config(args[1:]))
    except TrainerError as exc:
        if os.environ.get("CKPT_DEBUG") == "1":  # developers keep the whole chain, causes included
            _print_chain(exc)
        _error_exit(f"error: {' '.join(str(exc).split())}")
    except Interrupted as stop:  # the main rank has printed its one line
        _exit(stop.exit_code, leave_group=False)
    except Exception as exc:
        if not _collective_failure(exc):
            raise
        _error_exit(f"error: rank {os.environ.get('RANK', '0')}: {_collective_line(exc)}")
    _exit(0)


def _print_help(args: list[str]) -> None:
    """The generated flag table on stdout, for the `--policy.type` given (all built-in types if none)."""
    from trainer.cli.flags import help_text
    from trainer.cli.parse import normalize_argv
    from trainer.policies.common.base import known_types, register_import_path

    types = [arg.partition("=")[2] for arg in normalize_argv(args) if arg.startswith("--policy.type=")]
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


def _print_chain(exc: BaseException) -> None:
    """The traceback of `exc` with every cause and context, even those a `raise ... from None` hid."""
    import traceback

    exc.__suppress_context__ = False
    sys.stderr.write("".join(traceback.format_exception(exc)))


# How long a rank other than the main one holds its error line for the launcher to stop it (seconds).
HOLD_FOR_MAIN_RANK_S = 10.0


def _error_exit(line: str) -> None:
    """Print the error `line` and exit 1; under a launcher, the main rank's line first.

    Most errors reach every rank alike (a bad flag is parsed by each, a failed save is broadcast), and
    the main rank's line is the one to read first. A launched non-main rank therefore holds its line
    until the launcher stops it (torchrun sends SIGTERM to the others as soon as one rank fails, here
    the main one after printing) or HOLD_FOR_MAIN_RANK_S pass (an error of this rank alone), then
    prints it and exits 1. A rank that had already received a signal prints at once. The process group
    is not left: the peers may be gone already."""
    from trainer.distributed.interrupt import hold_until_signal

    if int(os.environ.get("RANK", "0")) != 0:
        hold_until_signal(HOLD_FOR_MAIN_RANK_S)
    _print_line(line)
    _exit(1, leave_group=False)


def _print_line(line: str) -> None:
    """One write per line: ranks sharing a terminal or log must not interleave inside a line."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


# What torch's backends say when a peer is gone or late (DDP's reducer raises them as RuntimeError).
_BACKEND_MARKERS = ("gloo", "NCCL", "Timed out", "Connection closed", "Connection reset")


def _collective_failure(exc: Exception) -> bool:
    """A collective that a peer left (it failed and exited) or did not join within the timeout."""
    import torch.distributed as dist

    if isinstance(exc, dist.DistError):
        return True
    text = str(exc)
    return (
        isinstance(exc, RuntimeError) and dist.is_initialized() and any(m in text for m in _BACKEND_MARKERS)
    )


def _collective_line(exc: Exception) -> str:
    from trainer.errors import backend_detail

    detail = backend_detail(exc)
    return (
        f"a collective with the other ranks failed ({detail}): another rank stopped or stalled (its own "
        "error line says why) or --collective_timeout_s passed; `last` names the newest complete checkpoint"
    )


def _eval(args: list[str]) -> None:
    """`trainer eval`: one line (or one JSON object with --json) from the main rank."""
    import json

    from trainer.cli.env_eval_command import WATCH_FLAG, is_env_eval, run_env_eval, run_watch
    from trainer.cli.parse import normalize_argv

    args = normalize_argv(args)
    if is_env_eval(args):
        from trainer.evaluation.evaluator import score_line

        watching = any(arg.startswith(WATCH_FLAG) for arg in args)
        result = run_watch(args) if watching else run_env_eval(args)
        line = (
            f"scored {result['scored']} steps of {result['output_dir']}" if watching else score_line(result)
        )
    else:
        from trainer.cli.eval_command import run_eval
        from trainer.evaluation.rollouts import summary_line

        result = run_eval(args)
        line = summary_line(result)
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps(result) if "--json" in args else line)


def _exit(code: int, leave_group: bool = True) -> None:
    """Leave the process group and exit at once.

    With FSDP2 on gloo a rank can abort at interpreter shutdown after all work succeeded; exiting with
    os._exit right after destroy_process_group makes a successful run exit 0 every time. After a
    failed collective or a signal the group is not left (that could wait for the other ranks).
    """
    import torch.distributed as dist

    if leave_group and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    if dist.is_available() and "WORLD_SIZE" in os.environ:
        os._exit(code)
    raise SystemExit(code)
