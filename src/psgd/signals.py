"""Signals: SIGTERM stops a run as Ctrl-C does, and no worker is left behind or hanging.

The process that calls psgd.run.train handles SIGTERM with `interrupt`: it passes the signal on to the
workers it launched and raises KeyboardInterrupt, which winds the run down as Ctrl-C does. A worker that
psgd's launcher started ends at once by the signal (`die`), and when its launcher dies (`die_with_parent`).
"""

import _thread
import multiprocessing
import os
import signal
import sys
import threading
import time
import types
from collections.abc import Iterator
from contextlib import contextmanager, suppress

received: str | None = None  # the name of the signal that interrupted this process's run, if one did

# modules that an exception raised between two of their lines can leave broken (a lock never released)
NOT_INTERRUPT_SAFE = frozenset({"threading", "queue"})
DEFER_S = 0.005  # how soon a deferred signal comes again
DEFER_AT_MOST_S = 1.0  # after this long it is raised where it lands (a join waiting in there)
_deferred_since: float | None = None
_coming_again: set[int] = set()  # signals sent again by _deferred that have not come yet


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _deferred(signum: int, frame: types.FrameType | None) -> bool:
    """Whether `signum` landed in threading's or queue's own code and was sent again DEFER_S later (once,
    though Lightning's handler calls psgd's twice), to be raised outside: raised in there, it can break a
    lock that TensorBoard's writer thread waits on."""
    global _deferred_since
    if frame is None or frame.f_globals.get("__name__") not in NOT_INTERRUPT_SAFE:
        _deferred_since = None
        return False
    now = time.monotonic()
    if _deferred_since is None:
        _deferred_since = now
    elif now - _deferred_since > DEFER_AT_MOST_S:
        _deferred_since = None
        return False
    if signum not in _coming_again:
        _coming_again.add(signum)
        _send_later(DEFER_S, signum)
    return True


def _send_later(delay: float, signum: int) -> None:
    """Send `signum` to the main thread `delay` seconds from now, from a bare _thread (a threading one
    would take locks that the main thread may hold)."""

    def send(ident: int) -> None:
        time.sleep(delay)
        _coming_again.discard(signum)
        with suppress(OSError, ValueError):
            signal.pthread_kill(ident, signum)

    _thread.start_new_thread(send, (threading.main_thread().ident,))


def ctrl_c(signum: int, frame: object = None) -> None:
    """SIGINT's handler: Python's KeyboardInterrupt, but not raised inside threading or queue."""
    if not _deferred(signum, frame):
        raise KeyboardInterrupt


def ctrl_c_out_of_threading() -> None:
    """SIGINT raises through `ctrl_c` where it raises through Python's own handler (not where it is
    ignored, as in a background job). Main thread only."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, ctrl_c)


def interrupt(signum: int, frame: object = None) -> None:
    """SIGTERM's handler: pass the signal on to this process's multiprocessing children, then raise
    KeyboardInterrupt. Further ones are ignored while the run winds down (their handler set to SIG_IGN)."""
    if _deferred(signum, frame):
        return
    global received
    received = signal.Signals(signum).name
    signal.signal(signum, signal.SIG_IGN)
    for child in multiprocessing.active_children():
        with suppress(OSError):
            os.kill(child.pid, signum)
    raise KeyboardInterrupt(received)


def _lost_interrupts_raised_again(unraisable) -> None:
    """sys.unraisablehook: a KeyboardInterrupt raised inside a finalizer (a __del__), where Python only
    prints it and goes on, is raised again: its signal is sent to the main thread once more, shortly after."""
    lost = isinstance(unraisable.exc_value, KeyboardInterrupt)
    if not lost or not _main_thread():
        _unraisablehook_before(unraisable)
        return
    sig = signal.SIGINT
    if received is not None:  # interrupt's: SIGTERM is ignored now, so handled by it once more
        sig = signal.SIGTERM
        signal.signal(sig, interrupt)
    elif not callable(signal.getsignal(sig)):  # SIGINT ignored
        return
    _send_later(0.05, sig)


_unraisablehook_before = sys.unraisablehook


def interrupted_exit_code() -> int:
    """128 + the signal that stopped the run (SIGTERM, else Ctrl-C's SIGINT), as a shell reports it."""
    return 128 + (signal.SIGTERM if received == "SIGTERM" else signal.SIGINT)


def die(signum: int, frame: object = None) -> None:
    """Signal handler: end this process by `signum` itself, as if it had no handler."""
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


_launched = False  # this process is a worker that psgd's launcher started (die_with_parent)


def handler_for_this_process():
    """`die` in a worker that psgd's launcher started, else `interrupt` (also in a process that merely runs
    under another multiprocessing pool, a sweep launcher's: it is the launcher of its own run)."""
    return die if _launched else interrupt


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """While the block runs, signals are handled as after `interrupt_on_sigterm`; afterwards as before.
    Main thread only: elsewhere this does nothing."""
    global received
    if not _main_thread():
        yield
        return
    received = None
    previous, sigint, hook = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT), sys.unraisablehook
    interrupt_on_sigterm()
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGINT) is ctrl_c:
            signal.signal(signal.SIGINT, sigint)
        # interrupted under the scripts' own handler: SIGTERM stays ignored, so that a second one (from
        # `timeout`, to the launcher and then its process group) does not break into the wind-down
        if received is None or previous is not interrupt:
            signal.signal(signal.SIGTERM, previous)
        sys.unraisablehook = hook


_masks_to_restore: list = []  # the signal masks from before each `held` block, innermost last


@contextmanager
def held(*signums: int) -> Iterator[None]:
    """Signals `signums` wait, blocked, until the block ends or `release_held` is called (main thread only):
    for torch's import (a handler that raises inside its C++ initialisers makes pybind11 abort the process),
    and for Hydra's set-up of a job's run dir (a signal there is handled inside the job, which removes it)."""
    if not _main_thread():
        yield
        return
    depth = len(_masks_to_restore)
    _masks_to_restore.append(signal.pthread_sigmask(signal.SIG_BLOCK, signums))
    try:
        yield
    finally:
        while len(_masks_to_restore) > depth:  # a pending signal is handled here
            signal.pthread_sigmask(signal.SIG_SETMASK, _masks_to_restore.pop())


def release_held() -> None:
    """End every `held` block's hold now; nothing without one."""
    while _masks_to_restore:
        signal.pthread_sigmask(signal.SIG_SETMASK, _masks_to_restore.pop())


def interrupt_on_sigterm() -> None:
    """For train.py and sweep.py from their first line, and in a run's fit: SIGTERM raises KeyboardInterrupt
    (`interrupt`), neither it nor Ctrl-C's is raised inside threading or queue, and one lost in a finalizer
    is raised again. Main thread only."""
    global _unraisablehook_before
    if not _main_thread():
        return
    signal.signal(signal.SIGTERM, interrupt)
    ctrl_c_out_of_threading()
    if sys.unraisablehook is not _lost_interrupts_raised_again:
        _unraisablehook_before = sys.unraisablehook
        sys.unraisablehook = _lost_interrupts_raised_again


def ignore_sigterm() -> None:
    """SIGTERM does nothing here from now on (a process on its way out that still has to say why)."""
    if _main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def wind_down_children(grace: float = 0.1, timeout: float = 60.0) -> list[int]:
    """Wait up to `grace` s for this process's multiprocessing children to end (a Ctrl-C from a terminal reached
    them too, and a launched worker ends at once on it), then send SIGTERM to those left (`kill -INT` or an IDE's
    stop button signalled this process alone: they would train on), wait up to `timeout` s more (a worker hung in
    a system call), then kill (and return) any still left."""
    children, deadline = multiprocessing.active_children(), time.monotonic() + grace
    for child in children:
        child.join(max(0.0, deadline - time.monotonic()))
        if child.is_alive():
            with suppress(OSError):
                os.kill(child.pid, signal.SIGTERM)
    killed = []
    for child in children:
        child.join(timeout)
        if child.is_alive():
            child.kill()
            child.join(5)
            killed.append(child.pid)
    return killed


def die_with_parent() -> None:
    """First in a worker that psgd's launcher started: SIGTERM to itself when the launcher dies, even by
    SIGKILL (a thread waits on its sentinel; torch's parent-death SIGINT never comes to a fork-server child)."""
    global _launched
    _launched = True
    parent = multiprocessing.parent_process()

    def watch() -> None:
        parent.join()
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="psgd-launcher-watch", daemon=True).start()
