"""psgd.signals: SIGTERM as Ctrl-C in the launching process, passed on to its workers."""

import contextlib
import multiprocessing
import os
import signal
import time

import pytest

from psgd import signals


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


def _ignore_sigterm_and_sleep(seconds: float, ready) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ready.set()
    time.sleep(seconds)


def _exit_with_whether_launched() -> None:
    raise SystemExit(3 if signals.launched_worker() is not None else 4)


def _start(target, *args) -> multiprocessing.Process:
    child = multiprocessing.get_context("spawn").Process(target=target, args=args)
    child.start()
    return child


def test_sigterm_raises_keyboard_interrupt_and_reaches_the_workers():
    before = signal.getsignal(signal.SIGTERM)
    child = _start(_sleep, 60)
    try:
        with pytest.raises(KeyboardInterrupt):
            with signals.sigterm_interrupts():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the handler raises here
        assert signals.received == "SIGTERM"
        child.join(10)
        assert child.exitcode == -signal.SIGTERM  # it got the signal passed on
    finally:
        if child.is_alive():
            child.kill()
    assert signal.getsignal(signal.SIGTERM) is before  # the caller's handler is back


def test_wind_down_kills_a_worker_that_does_not_stop():
    ready = multiprocessing.get_context("spawn").Event()
    child = _start(_ignore_sigterm_and_sleep, 60, ready)
    assert ready.wait(60)  # its handler is installed (a spawned child may take seconds to start)
    os.kill(child.pid, signal.SIGTERM)
    start = time.monotonic()
    assert signals.wind_down_children(timeout=0.5) == [child.pid]
    assert time.monotonic() - start < 10
    assert child.exitcode == -signal.SIGKILL


def test_only_workers_of_psgds_launcher_die_by_sigterm():
    # a process that merely runs under some multiprocessing pool (a sweep launcher's) keeps the
    # Ctrl-C handling: it is the launcher of its own run
    assert signals.launched_worker() is None and signals.handler_for_this_process() is signals.interrupt
    for launching, code in ((True, 3), (False, 4)):
        with signals.launching() if launching else contextlib.nullcontext():
            child = _start(_exit_with_whether_launched)
            child.join(30)
        assert child.exitcode == code
    assert signals.LAUNCHER_ENV not in os.environ
