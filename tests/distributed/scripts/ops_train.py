"""`trainer train` with the fault hooks of the operations tests (tests/distributed/test_operations.py),
patched in here so the trainer carries no test code. Runs under torchrun or as one plain process.

Hook flags come first and are removed before the trainer parses the rest:
  --hook-step-sleep=SECONDS      every rank sleeps this long in each training step: a floor under a step's
                                 time (a run long enough for a peer to start beside it), never a wait for a state.
  --hook-hold=PATH               every rank waits at its second training step until PATH exists.
  --hook-hold-step=STEP:DIR      in torchrun's first attempt (TORCHELASTIC_RESTART_COUNT=0), every rank
                                 writes DIR/rank<R> ("pid parent-pid world-size") before loop step STEP
                                 and waits (at most 120 s) until DIR/release exists: a test can kill a
                                 node while every rank is at a known step.
  --hook-until-signalled=CALL    from its CALL-th training step on, every rank waits at the start of each
                                 step until it has got SIGTERM or SIGINT (a run that cannot end by
                                 itself before the signal it is sent reaches it, on a machine of any speed).
  --hook-signal=RANK:CALL:SIGNUM[:TIMES[:GAP]]  RANK sends itself SIGNUM (TIMES times, default 1,
                                 GAP seconds apart, default 0.2) at the start of its CALL-th training step.
  --hook-signal-launcher=RANK:CALL:SIGNUM  RANK sends SIGNUM to its parent, the launcher (torchrun), and
                                 to nothing else, at the start of its CALL-th training step.
  --hook-stall=RANK:CALL         RANK waits at the start of its CALL-th training step until it gets SIGTERM
                                 or SIGINT (the launcher's, once the other ranks failed): a stall longer
                                 than any timeout, on a machine of any speed.
  --hook-fail-commit=STEP        the main rank's commit of STEP raises OSError (a rename refused).
  --hook-slow-commit=STEP:SECONDS  the main rank's commit of STEP sleeps SECONDS first (its files are
                                 written into the temporary step directory, `last` not moved yet).
  --hook-fail-shard=RANK:STEP    RANK's DCP shard write into STEP raises OSError (disk full).
  --hook-shard-after-signal=RANK:STEP:SENDER  RANK's DCP shard write into STEP waits until rank SENDER
                                 has sent its --hook-signal (the write is still in flight when it lands).
  --hook-delay-start=RANK:SECONDS  RANK sleeps SECONDS before the trainer starts parsing.
  --hook-pause-while=PATH        before each training step, every rank waits while PATH exists (at most 240 s
                                 at a time): a run paused with its processes alive (a fault-tolerant group
                                 keeps its heartbeats to the Lighthouse, which SIGSTOP would stop).
  --hook-hold-heal=PATH          a replica group that heals from a live peer (fault tolerance) writes PATH
                                 as its fetch of the peer's state begins (torchft's checkpoint transport),
                                 and waits there (at most 240 s) before fetching: a test can kill it mid-heal.
  --hook-tag-errors              every error line the CLI prints ends with ` [hook: rank R]`.
  --hook-flip-last=STEP          the main rank repoints `checkpoints/last` to STEP right after it read it
                                 for `--resume=true --output_dir` (the saved config, at parse); the other
                                 ranks read it a second later, so an unshared choice would be another step.
Every rank prints `hook: rank R pid P` at start and `hook: rank R resumes from DIR` after phase 1.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from hook_flags import install_hooks

import trainer.cli.app as cli
import trainer.engine.checkpoint.resume as resume
import trainer.engine.committed_step as committed_step
from ckpt_tools import layout
from ckpt_tools.files import commit as ckpt_commit
from trainer.distributed import interrupt

RANK = int(os.environ.get("RANK", "0"))
OUTPUT_DIR = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--output_dir=")), "")


def say(line: str) -> None:
    """One write per line: print() writes the text and its newline apart, and the other rank's output
    can fall in between."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def before_step(action) -> None:
    """Run `action(call)` on this rank before each training step; `call` counts from 1."""
    train_step = committed_step._train_step
    count = 0

    def step(*args, **kwargs):
        nonlocal count
        count += 1
        action(count)
        return train_step(*args, **kwargs)

    committed_step._train_step = step


def step_sleep(seconds: float) -> None:
    before_step(lambda call: time.sleep(seconds))


def hold(path: str) -> None:
    def wait(call: int) -> None:
        while call == 2 and not os.path.exists(path):
            time.sleep(0.1)

    before_step(wait)


def hold_step(step: int, directory: str) -> None:
    if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return
    start = [0]
    before_prepare = resume.before_prepare

    def resumed(*args, **kwargs):
        point = before_prepare(*args, **kwargs)
        start[0] = point.start_step
        return point

    resume.before_prepare = resumed

    def wait(call: int) -> None:
        if start[0] + call != step:
            return
        world = os.environ.get("WORLD_SIZE", "1")
        marker = os.path.join(directory, f"rank{RANK}")
        with open(marker + ".tmp", "w") as f:
            f.write(f"{os.getpid()} {os.getppid()} {world}")
        os.replace(marker + ".tmp", marker)
        deadline = time.monotonic() + 120
        while not os.path.exists(os.path.join(directory, "release")):
            if time.monotonic() > deadline:
                sys.exit(f"hook: rank {RANK} was never released")
            time.sleep(0.05)

    before_step(wait)


# Hooks that wait for a state give up after this long: a stuck run fails its test instead of hanging.
WAIT_S = 240.0


def wait_until(condition) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)


def until_signalled(call: int) -> None:
    before_step(lambda now: wait_until(lambda: bool(interrupt._signalled)) if now >= call else None)


def _signal_mark(rank: int) -> Path:
    """The file rank `rank` leaves just before its --hook-signal, for the hooks that wait for it."""
    return Path(OUTPUT_DIR) / f".hook-signal-rank{rank}"


def send_signal(rank: int, call: int, signum: int, times: int = 1, gap: float = 0.2) -> None:
    def send(now: int) -> None:
        if rank == RANK and now == call:
            last = os.path.join(OUTPUT_DIR, "checkpoints", "last")
            pointed = os.readlink(last) if os.path.islink(last) else None
            say(
                f"hook: rank {RANK} sends itself signal {signum} x{times} at step call {call} (last -> {pointed})"
            )
            _signal_mark(RANK).touch()
            for _ in range(times):
                os.kill(os.getpid(), signum)
                time.sleep(gap)

    before_step(send)


def signal_launcher(rank: int, call: int, signum: int) -> None:
    def send(now: int) -> None:
        if rank == RANK and now == call:
            say(f"hook: rank {RANK} sends its launcher signal {signum} at step call {call}")
            os.kill(os.getppid(), signum)

    before_step(send)


def stall(rank: int, call: int) -> None:
    def wait(now: int) -> None:
        if rank == RANK and now == call:
            say(f"hook: rank {RANK} stalls at step call {call} until it is signalled")
            wait_until(lambda: bool(interrupt._signalled))

    before_step(wait)


def fail_commit(step: int) -> None:
    commit_step_dir = ckpt_commit.commit_step_dir

    def failing(tmp_dir, root, at, **kwargs):
        if at == step:
            raise OSError(f"injected: rename of {os.path.basename(tmp_dir)} refused")
        return commit_step_dir(tmp_dir, root, at, **kwargs)

    ckpt_commit.commit_step_dir = failing


def slow_commit(step: int, seconds: float) -> None:
    commit_step_dir = ckpt_commit.commit_step_dir

    def slow(tmp_dir, root, at, **kwargs):
        if at == step:
            time.sleep(seconds)
        return commit_step_dir(tmp_dir, root, at, **kwargs)

    ckpt_commit.commit_step_dir = slow


def shard_after_signal(rank: int, step: int, sender: int) -> None:
    from torch.distributed.checkpoint import FileSystemWriter

    write_data = FileSystemWriter.write_data
    tmp_name = layout.TMP_PREFIX + layout.step_dir_name(step)

    def held(self, plan, planner):
        if rank == RANK and tmp_name in str(self.path):
            wait_until(_signal_mark(sender).exists)
        return write_data(self, plan, planner)

    FileSystemWriter.write_data = held


def fail_shard(rank: int, step: int) -> None:
    from torch.distributed.checkpoint import FileSystemWriter

    write_data = FileSystemWriter.write_data
    tmp_name = layout.TMP_PREFIX + layout.step_dir_name(step)

    def failing(self, plan, planner):
        if rank == RANK and tmp_name in str(self.path):
            raise OSError(28, "injected: No space left on device")
        return write_data(self, plan, planner)

    FileSystemWriter.write_data = failing


def flip_last(step: int) -> None:
    saved_config_path = resume.saved_config_path

    def find(output_dir):
        if RANK != 0:
            time.sleep(1.0)
        found = saved_config_path(output_dir)
        if RANK == 0:
            ckpt_commit.point_last(os.path.join(output_dir, "checkpoints"), layout.step_dir_name(step))
            say(f"hook: rank 0 resolved {found}, then moved last to {step}")
        return found

    resume.saved_config_path = find


def delay_start(rank: int, seconds: float) -> None:
    if rank == RANK:
        time.sleep(seconds)


def pause_while(path: str) -> None:
    before_step(lambda call: wait_until(lambda: not os.path.exists(path)))


def hold_heal(path: str) -> None:
    from torchft.checkpointing.http_transport import HTTPTransport

    recv_checkpoint = HTTPTransport.recv_checkpoint

    def held(self, *args, **kwargs):
        say(f"hook: rank {RANK} holds its fetch of a peer's state")
        Path(path).touch()
        wait_until(lambda: False)
        return recv_checkpoint(self, *args, **kwargs)

    HTTPTransport.recv_checkpoint = held


def tag_errors() -> None:
    print_line = cli._print_line
    cli._print_line = lambda line: print_line(f"{line} [hook: rank {RANK}]")


def report_resume() -> None:
    before_prepare = resume.before_prepare

    def report(*args, **kwargs):
        point = before_prepare(*args, **kwargs)
        say(f"hook: rank {RANK} resumes from {point.step_dir}")
        return point

    resume.before_prepare = report


HOOKS = {
    "--hook-hold": hold,
    "--hook-hold-step": hold_step,
    "--hook-step-sleep": step_sleep,
    "--hook-until-signalled": until_signalled,
    "--hook-signal": send_signal,
    "--hook-signal-launcher": signal_launcher,
    "--hook-delay-start": delay_start,
    "--hook-hold-heal": hold_heal,
    "--hook-pause-while": pause_while,
    "--hook-tag-errors": tag_errors,
    "--hook-flip-last": flip_last,
    "--hook-stall": stall,
    "--hook-fail-commit": fail_commit,
    "--hook-slow-commit": slow_commit,
    "--hook-fail-shard": fail_shard,
    "--hook-shard-after-signal": shard_after_signal,
}


if __name__ == "__main__":
    say(f"hook: rank {RANK} pid {os.getpid()}")
    report_resume()
    cli.main(["train", *install_hooks(sys.argv[1:], HOOKS)])
