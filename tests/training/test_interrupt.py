"""The signal handling of a run (trainer/interrupt.py), in this process: a repeated delivery is one
signal, and the hold that lets the main rank's error line come first ends at a signal or at its limit.
The full behaviour under torchrun is in tests/distributed/test_operations.py."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from helpers.waiting import wait_for
from trainer.distributed import interrupt
from trainer.distributed.interrupt import Interrupts, hold_until_signal


@pytest.fixture(autouse=True)
def own_handlers(monkeypatch):
    """Each test starts with no signal recorded and leaves pytest's handlers as they were."""
    monkeypatch.setattr(interrupt, "_signalled", [])
    saved = {signum: signal.getsignal(signum) for signum in interrupt.SIGNALS}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def test_a_signal_delivered_twice_at_once_is_one_request(monkeypatch):
    """Slurm signals every process of the step and torchrun forwards its copy: not a second signal
    (which would abort without a checkpoint), the run goes on to save."""

    def abort(code: int) -> None:
        raise AssertionError(f"aborted with {code}")

    monkeypatch.setattr(os, "_exit", abort)  # what a second signal's handler calls
    interrupts = Interrupts()
    interrupts.install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
        assert interrupts.received == signal.SIGTERM
    finally:
        interrupts.restore()


def test_the_hold_ends_at_a_signal_and_then_ignores_signals():
    """The signal is sent once the hold has put its handler in place, whatever the machine's speed (a
    signal sent before would end pytest itself)."""
    before = signal.getsignal(signal.SIGTERM)

    def signal_the_hold() -> None:
        wait_for(lambda: signal.getsignal(signal.SIGTERM) is not before, "handler of the hold")
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=signal_the_hold, daemon=True).start()
    started = time.monotonic()
    hold_until_signal(30.0)
    assert time.monotonic() - started < 10
    os.kill(os.getpid(), signal.SIGTERM)  # ignored now: the caller prints its line undisturbed
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN


def test_the_hold_ends_at_its_limit_or_at_once_after_a_signal_of_the_run(monkeypatch):
    started = time.monotonic()
    hold_until_signal(0.3)
    assert 0.3 <= time.monotonic() - started < 10
    monkeypatch.setattr(interrupt, "_signalled", [signal.SIGTERM])  # torchrun's SIGTERM came while training
    started = time.monotonic()
    hold_until_signal(30.0)
    assert time.monotonic() - started < 1
