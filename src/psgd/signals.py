"""Signals and process supervision: SIGTERM stops a run as Ctrl-C does, and no worker is left behind or hanging.

- The process that calls psgd.run.train (psgd's launching process, a one-worker run, a torchrun or srun
  worker) handles SIGTERM with `interrupt`: it passes the signal on to the workers it launched and raises
  KeyboardInterrupt, which Lightning and psgd wind down as Ctrl-C (finished epochs kept, metrics.json
  marked "interrupted", one line).
- A worker that psgd's launcher started ends at once by the signal (`die`), as a killed worker does: its
  launcher then stops the others and names its rank, or marks the run interrupted.
- Such a worker sends itself SIGTERM when its launcher dies, even by SIGKILL (`die_with_parent`); a
  torchrun worker does when its agent dies (`stop_with_agent`), and leaves a mark while it runs
  (`mark_running_under_torchrun`) so that the others can name a worker that died without a word.
- SIGHUP (the terminal closed) is taken as SIGTERM unless it is ignored (`nohup`): `hang_up_as_sigterm`.
- The KeyboardInterrupt of Ctrl-C or SIGTERM is not raised inside the standard library's thread
  synchronisation (`_deferred`), and one lost in a finalizer is raised again (`raise_lost_interrupts_again`).
"""

import _thread
import atexit
import multiprocessing
import os
import select
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import types
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path

received: str | None = None  # the name of the signal that interrupted this process's run, if one did


# modules whose code an exception raised between two of its lines can leave broken for good
NOT_INTERRUPT_SAFE = frozenset({"threading", "queue"})
DEFER_S = 0.005  # how soon a deferred signal comes again
DEFER_AT_MOST_S = 1.0  # how long it is deferred at most: then raised where it lands (a wait in there)
_deferred_since: float | None = None  # when the signal being deferred first came
_coming_again: set[int] = set()  # the signals that _deferred sent again and that have not come yet


def _deferred(signum: int, frame: types.FrameType | None) -> bool:
    """For the handlers that raise KeyboardInterrupt: whether the signal `signum` came while the main
    thread ran threading's or queue's own code (`frame`, where it stopped), and was sent again DEFER_S
    later, to be raised outside. Raised in there, it can break a lock or queue that a library's thread
    waits on (TensorBoard's writer thread, which the logger's close then waits for). Deferred
    DEFER_AT_MOST_S at most, so that a main thread blocked in a wait in there (a join) is still
    interrupted. Sent again once: Lightning's SIGTERM handler calls psgd's twice, and a second
    KeyboardInterrupt would break into the run's wind-down."""
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
    """Send `signum` to the main thread `delay` seconds from now, from a thread of _thread's: one of
    threading's would take its module's locks, which the main thread may hold where it stopped."""

    def send(ident: int) -> None:
        time.sleep(delay)
        _coming_again.discard(signum)
        with suppress(OSError, ValueError):
            signal.pthread_kill(ident, signum)

    _thread.start_new_thread(send, (threading.main_thread().ident,))


def ctrl_c(signum: int, frame: object = None) -> None:
    """SIGINT's handler: KeyboardInterrupt, as Python's own, but not raised inside threading or
    queue (`_deferred`)."""
    if _deferred(signum, frame):
        return
    raise KeyboardInterrupt


def ctrl_c_out_of_threading() -> None:
    """SIGINT raises KeyboardInterrupt through `ctrl_c` where it raises it through Python's own handler
    (not where it is ignored, a background job, or handled otherwise): in train.py and sweep.py, around
    a run's fit and test, and in the workers that psgd's launcher starts (Ctrl-C reaches them too, and
    rank 0 closes the TensorBoard logger as it winds down). Main thread only."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, ctrl_c)


def interrupt(signum: int, frame: object = None) -> None:
    """Signal handler: pass `signum` on to this process's multiprocessing children, then raise
    KeyboardInterrupt (not inside threading or queue: `_deferred`). Further SIGTERMs are ignored
    while the run winds down (a process group gets the signal once from the sender and once from its
    launcher)."""
    if _deferred(signum, frame):
        return
    global received
    received = signal.Signals(signum).name
    signal.signal(signum, signal.SIG_IGN)
    for child in multiprocessing.active_children():
        with suppress(OSError):
            os.kill(child.pid, signum)
    raise KeyboardInterrupt(received)


def _interrupt_again(signum: int, frame: object = None) -> None:
    """`interrupt`'s KeyboardInterrupt once more (the workers already have the signal), for
    `_lost_interrupts_raised_again`."""
    if _deferred(signum, frame):
        return
    signal.signal(signum, signal.SIG_IGN)
    raise KeyboardInterrupt(received)


def _lost_interrupts_raised_again(unraisable) -> None:
    """sys.unraisablehook while interrupts stop runs. Python runs a signal handler between any two
    bytecodes of the main thread, inside a finalizer too (a __del__, a weakref callback), where an
    exception cannot propagate: Python prints "Exception ignored in ..." and goes on. A KeyboardInterrupt
    of Ctrl-C or `interrupt` lost that way is raised again, with no traceback printed: the signal is sent
    to the main thread once more, shortly after, from another thread (sent from here, its handler would
    run inside this hook, itself a place an exception cannot leave)."""
    lost = isinstance(unraisable.exc_value, KeyboardInterrupt)
    if not lost or threading.current_thread() is not threading.main_thread():
        _unraisablehook_before(unraisable)
        return
    sig = signal.SIGINT
    if received is not None:  # interrupt's: SIGTERM is ignored now, so through a handler of its own
        sig = signal.SIGTERM
        signal.signal(sig, _interrupt_again)
    elif not callable(signal.getsignal(sig)):  # no handler of Python's would raise it (SIGINT ignored)
        return
    _send_later(0.05, sig)


_unraisablehook_before = sys.unraisablehook


def raise_lost_interrupts_again() -> None:
    """From now on a KeyboardInterrupt lost in a finalizer is raised again (`_lost_interrupts_raised_again`)."""
    global _unraisablehook_before
    if sys.unraisablehook is not _lost_interrupts_raised_again:
        _unraisablehook_before = sys.unraisablehook
        sys.unraisablehook = _lost_interrupts_raised_again


def interrupted_exit_code() -> int:
    """The exit code of a run that a signal stopped, as a shell reports it: 128 + the signal (SIGTERM
    when `interrupt` received one, else Ctrl-C's SIGINT)."""
    return 128 + (signal.SIGTERM if received == "SIGTERM" else signal.SIGINT)


def die(signum: int, frame: object = None) -> None:
    """Signal handler: end this process by `signum` itself, as if it had no handler."""
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


LAUNCHER_ENV = "PSGD_LAUNCHER_PID"  # set by the process that starts workers, while they run (`launching`)


@contextmanager
def launching() -> Iterator[None]:
    """While the block runs, worker processes started from this one know it as their launcher (the
    variable is inherited when they start): `launched_worker` tells them from other processes."""
    previous = os.environ.get(LAUNCHER_ENV)
    os.environ[LAUNCHER_ENV] = str(os.getpid())
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(LAUNCHER_ENV, None)
        else:
            os.environ[LAUNCHER_ENV] = previous


def launched_worker() -> multiprocessing.process.BaseProcess | None:
    """The launcher of this process when it is a worker that psgd's launcher started (spawn or fork
    server), else None (the launcher itself, a one-worker run, a torchrun or srun worker, a process
    that some other multiprocessing pool runs psgd in)."""
    parent = multiprocessing.parent_process()
    if parent is None or os.environ.get(LAUNCHER_ENV) != str(parent.pid):
        return None
    return parent


def handler_for_this_process():
    """`die` in a worker that psgd's launcher started, else `interrupt`."""
    return die if launched_worker() is not None else interrupt


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """While the block runs, SIGTERM raises KeyboardInterrupt here (after passing it on to the
    workers), and neither it nor Ctrl-C's is raised inside threading or queue (`_deferred`). Python
    lets only the main thread set handlers: elsewhere this does nothing."""
    global received
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = None
    previous = signal.signal(signal.SIGTERM, interrupt)
    sigint = signal.getsignal(signal.SIGINT)
    ctrl_c_out_of_threading()
    hook = sys.unraisablehook
    raise_lost_interrupts_again()
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGINT) is ctrl_c:
            signal.signal(signal.SIGINT, sigint)
        if received is None or previous is not interrupt:
            signal.signal(signal.SIGTERM, previous)
        # else: interrupted under the scripts' own handler (interrupt_on_sigterm), the process is on its way out
        # and SIGTERM stays ignored: a second one (`timeout` signals the launcher, then its process group)
        # would break into the run's wind-down
        sys.unraisablehook = hook


@contextmanager
def held(*signums: int) -> Iterator[None]:
    """Signals `signums` sent while the block runs wait, blocked, and are handled as usual as soon as it
    ends (in the main thread; elsewhere this holds nothing). For torch's import: a handler that raises, run
    inside one of its C++ initialisers that call back into Python, makes pybind11 abort the process
    ("terminate called after throwing ... KeyboardInterrupt") instead of the one line and exit code 130 /
    143. Threads started in the block inherit the mask, so none of them takes the signal instead."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, signums)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)  # a pending signal is handled here


_releases: list = []  # what ends the innermost `held_until_released`, while one holds signals


@contextmanager
def held_until_released(*signums: int) -> Iterator[None]:
    """As `held`, but also ended earlier by `release_held`: for Hydra's setup of a job, which makes the
    run dir, saves the config into it and opens its log before it calls the job. A signal there would
    leave that dir behind with no results; held, it is handled where the job releases it, inside the
    job's handler, which removes the dir."""
    with ExitStack() as hold:
        hold.enter_context(held(*signums))
        _releases.append(hold.close)  # closed once: by release_held or here, at the block's end
        try:
            yield
        finally:
            if hold.close in _releases:
                _releases.remove(hold.close)


def release_held() -> None:
    """End `held_until_released`'s hold now (a signal sent meanwhile is handled here); nothing without one."""
    while _releases:
        _releases.pop()()


def interrupt_on_sigterm() -> None:
    """For train.py and sweep.py, from their first line: SIGTERM stops them as Ctrl-C does also outside a
    run's fit and test (while torch loads, the data is read, between a sweep's jobs), and so do Ctrl-C
    (`ctrl_c_out_of_threading`) and a hang-up. Main thread only: elsewhere this does nothing."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, interrupt)
        ctrl_c_out_of_threading()  # Ctrl-C's KeyboardInterrupt is not raised inside threading or queue either
        hang_up_as_sigterm()  # closing the terminal too
        raise_lost_interrupts_again()


_terminal_fds: list[int] = []  # this process's stdout / stderr where they were a terminal when hang-ups were set up


def hang_up_as_sigterm() -> None:
    """From now on SIGHUP (the terminal closed, an ssh session dropped) stops this process as SIGTERM
    does, so a run is marked interrupted with its finished epochs and a sweep writes its report. Left as
    it is where SIGHUP is ignored (`nohup`: the run goes on). Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGHUP) in (signal.SIG_IGN, _hang_up):
        return
    _terminal_fds[:] = [fd for fd in (1, 2) if os.isatty(fd)]
    signal.signal(signal.SIGHUP, _hang_up)


def _hang_up(signum: int, frame: object = None) -> None:
    """SIGHUP's handler: output that went to the terminal goes nowhere now (writing to a hung-up
    terminal fails with EIO, which would break into the wind-down's lines), then SIGTERM to this
    process, which its handler takes as ever (`interrupt`, or `die` in a launched worker)."""
    signal.signal(signum, signal.SIG_IGN)
    if _terminal_fds:
        with suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            for fd in _terminal_fds:
                os.dup2(devnull, fd)
            os.close(devnull)
    os.kill(os.getpid(), signal.SIGTERM)


def ignore_sigterm() -> None:
    """From now on SIGTERM does nothing here (a process on its way out that still has to say why);
    Python lets only the main thread set handlers: elsewhere this does nothing."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def wind_down_children(timeout: float = 60.0) -> list[int]:
    """After an interrupt: wait up to `timeout` seconds for this process's multiprocessing children
    (the workers, which got the signal too) to finish their own shutdown, then kill any left.
    Returns the pids that had to be killed."""
    children = multiprocessing.active_children()
    killed = []
    for child in children:
        child.join(timeout)
        if child.is_alive():
            child.kill()
            child.join(5)
            killed.append(child.pid)
    return killed


def die_with_parent() -> None:
    """In a worker that psgd's launcher started: SIGTERM to itself when its launcher dies (even by
    SIGKILL). A daemon thread waits on the launcher's sentinel, a pipe that closes when it exits. torch's
    spawn asks the kernel for SIGINT on the parent's death instead, which a worker of a background job
    ignores, and which never comes for a fork-server child, whose parent is the server."""
    parent = launched_worker()
    if parent is None:
        return

    def watch() -> None:
        parent.join()
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="psgd-launcher-watch", daemon=True).start()


_agent_watched = False  # stop_with_agent's thread runs in this process (one is enough)
TORCHRUN_MARKS = "psgd-torchrun-"  # the temp folder of a torchrun job's marks on a machine: + agent's tag, attempt
agent_gone = False  # stop_with_agent's thread found torchrun's agent gone (and stops this worker)
_marked = False  # this process has marked itself running under torchrun (mark_running_under_torchrun)
oom_kills_at_mark: int | None = None  # the kernel's OOM-kill count when this torchrun worker marked itself


def stop_with_agent() -> None:
    """In a worker that torchrun started: SIGTERM to itself when torchrun's agent, its parent, dies (the
    OOM killer, `kill -9`): torchrun starts each worker in a session of its own with no parent-death
    signal. SIGTERM then stops this worker as a SIGTERM from the agent would (`interrupt`)."""
    global _agent_watched
    if _agent_watched:
        return
    _agent_watched = True
    agent = os.getppid()
    try:
        exited = os.pidfd_open(agent)  # readable once that process has exited (Linux >= 5.3)
    except (AttributeError, OSError):
        exited = None

    def watch() -> None:
        if exited is not None:
            select.select([exited], [], [])
        while os.getppid() == agent:  # (the fallback; with the pidfd, already reparented)
            time.sleep(1.0)
        global agent_gone
        agent_gone = True
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="psgd-agent-watch", daemon=True).start()


def proc_stat(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name (state first, then the parent's pid ...,
    the start time at index 19), or [] where there is no such process or no /proc."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def process_tag(pid: int) -> str:
    """`<pid>-<start time>`: names one process for as long as the machine runs (a pid is reused)."""
    fields = proc_stat(pid)
    return f"{pid}-{fields[19] if len(fields) > 19 else 0}"


def this_process() -> dict[str, str | int]:
    """This process as a run's record names it: its machine, pid and `process_tag` (`alive` finds it)."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "tag": process_tag(os.getpid())}


PROC = "/proc/self/stat"  # Linux's process table; macOS and Windows have none


def alive(process: object) -> bool:
    """Whether the process a record names (`this_process`) still runs: on this machine, the same pid and
    start time (a pid is reused). False for one on another machine, or a record without it. Without /proc
    (macOS) the pid alone is asked: a reused pid reads as alive, the safe side for a guard against
    continuing a sweep twice at once."""
    if not isinstance(process, dict) or process.get("host") != socket.gethostname():
        return False
    try:
        pid = int(process["pid"])
        if not os.path.exists(PROC):
            return _pid_exists(pid)
        return process_tag(pid) == process.get("tag") and proc_stat(pid)[0] != "Z"
    except (KeyError, TypeError, ValueError, IndexError):
        return False


def _pid_exists(pid: int) -> bool:
    if os.name != "posix" or pid <= 0:  # Windows' os.kill ends the process; pid <= 0 names process groups
        return False
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists (and may be signalled)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: it exists
        return True
    except OSError:
        return False
    return True


def still_running(record: dict) -> bool:
    """Whether a run's record (metrics.json) is still being written: not finished, and the process it
    names alive on this machine (one that ended without its final status was killed)."""
    return record.get("status") in ("running", "trained") and alive(record.get("process"))


def temp_folder_of_this_process(prefix: str) -> Path:
    """A new folder `<temp dir>/<prefix><pid>-<start time>-<random>` for this process to take away
    when done. Those that earlier processes left (killed outright before they could) go here."""
    remove_left_folders(prefix)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{process_tag(os.getpid())}-"))


def remove_left_folders(prefix: str) -> None:
    """Take away this user's folders `<temp dir>/<prefix><pid>-<start time>-...` whose process is gone."""
    for folder in Path(tempfile.gettempdir()).glob(f"{prefix}*"):
        with suppress(OSError, ValueError):
            pid, started = folder.name[len(prefix) :].split("-")[:2]
            gone = process_tag(int(pid)) != f"{pid}-{started}" if os.path.exists(PROC) else not _pid_exists(int(pid))
            if folder.stat().st_uid == os.getuid() and gone:
                shutil.rmtree(folder, ignore_errors=True)


def _torchrun_marks() -> tuple[Path, int] | None:
    """In a worker that torchrun started: the folder of this job attempt's running marks on this
    machine (named by the agent's pid and start time and the restart count) and this worker's local
    rank; else None."""
    env = os.environ
    if "TORCHELASTIC_RUN_ID" not in env or agent_gone or os.getppid() == 1:
        return None
    try:
        local_rank = int(env["LOCAL_RANK"])
    except (KeyError, ValueError):
        return None
    attempt = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    return Path(tempfile.gettempdir(), f"{TORCHRUN_MARKS}{process_tag(os.getppid())}-{attempt}"), local_rank


def mark_running_under_torchrun() -> None:
    """In a worker that torchrun started: leave a mark (a file named by the local rank, holding the
    pid) that says "ended" once this process exits in any way Python sees (done, an error, an
    interrupt). A worker that ends without saying so (SIGKILL, the OOM killer, a crash) is found by
    `torchrun_workers_gone`; torchrun's agent then stops the others with SIGTERM, and they can say
    which rank died instead of calling the run interrupted."""
    where = _torchrun_marks()
    global oom_kills_at_mark, _marked
    if where is None or _marked:  # once per process: a job marks it as Hydra hands it over, and again to train
        return
    _marked = True
    oom_kills_at_mark = oom_kills()
    remove_left_folders(TORCHRUN_MARKS)  # of jobs whose workers were all killed outright
    folder, local_rank = where
    agent, me = os.getppid(), os.getpid()
    with suppress(OSError):
        folder.mkdir(exist_ok=True)
        _write_mark(folder, local_rank, str(me))

        def ended() -> None:
            with suppress(OSError):
                _write_mark(folder, local_rank, f"{me} ended")
            marks = _marks(folder)
            # the last one out takes the folder away: every other worker ended, or died (two ending at
            # once may both take it)
            if not any(_running(pid, agent) and not done for pid, done in marks.values()):
                for rank in marks:
                    with suppress(OSError):
                        (folder / str(rank)).unlink()
                with suppress(OSError):
                    folder.rmdir()

        atexit.register(ended)


def wait_for_this_machines_workers(within_s: float) -> None:
    """In a worker that torchrun started, before it takes away a run dir that every worker of this machine
    shares: wait (at most `within_s`, or until a signal comes, such as the agent's SIGTERM once another
    worker exited) until each of them has marked itself running (`mark_running_under_torchrun`, which
    psgd.cli calls as Hydra hands it the job). A worker not yet marked may be inside Hydra's set-up of that
    dir, between making it and opening its log file there."""
    where = _torchrun_marks()
    try:
        workers = int(os.environ["LOCAL_WORLD_SIZE"])
    except (KeyError, ValueError):
        return
    if where is None:  # not under torchrun
        return
    folder, _ = where
    deadline = time.monotonic() + within_s
    try:
        while len(_marks(folder)) < workers and time.monotonic() < deadline:
            time.sleep(0.05)
    except KeyboardInterrupt:  # the agent stops this worker (another one exited), or Ctrl-C: wait no more
        pass


def _write_mark(folder: Path, local_rank: int, text: str) -> None:
    """Write a mark whole (a reader never sees half of it)."""
    part = folder / f".{local_rank}.{os.getpid()}"
    part.write_text(text)
    os.replace(part, folder / str(local_rank))


def _marks(folder: Path) -> dict[int, tuple[int, bool]]:
    """The marks in `folder`: local rank -> (pid, whether it ended as Python sees it)."""
    marks = {}
    with suppress(OSError):
        for mark in folder.iterdir():
            with suppress(OSError, ValueError):
                pid, *said = mark.read_text().split()
                marks[int(mark.name)] = (int(pid), said == ["ended"])
    return marks


def _running(pid: int, parent: int) -> bool:
    """Whether process `pid` is a child of `parent` that has not exited (a zombie has; Linux: /proc).
    Without /proc, whether the pid exists (a zombie does: a dead worker is then not told from the others)."""
    if not os.path.exists(PROC):
        return _pid_exists(pid)
    fields = proc_stat(pid)
    return len(fields) > 1 and fields[1] == str(parent) and fields[0] not in ("Z", "X", "x")


def torchrun_workers_gone() -> tuple[list[int], list[int]]:
    """In a worker that torchrun started: (the global ranks of the workers on this machine that died
    without a word: their mark does not say "ended", `mark_running_under_torchrun`, and their process
    is gone or a zombie; the global ranks of the others here, this one's included, running or ended as
    Python sees it); ([], []) elsewhere. torchrun numbers one machine's workers RANK - LOCAL_RANK +
    local rank. Workers on other machines cannot be seen from here."""
    where = _torchrun_marks()
    if where is None:
        return [], []
    folder, local_rank = where
    agent, base = os.getppid(), int(os.environ.get("RANK", local_rank)) - local_rank
    gone, others = [], [base + local_rank]
    for rank, (pid, ended) in _marks(folder).items():
        if rank != local_rank:
            (others if ended or _running(pid, agent) else gone).append(base + rank)
    return sorted(gone), sorted(others)


VMSTAT = "/proc/vmstat"


def oom_kills() -> int | None:
    """How many processes the kernel's out-of-memory killer has killed since boot, a memory cgroup's
    kills included (Linux >= 4.13); None where the kernel does not say."""
    try:
        with open(VMSTAT) as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def oom_kills_since(before: int | None) -> int:
    """By how many the kernel's OOM-kill count (`oom_kills`) rose since it was `before`; 0 where
    either count is unknown."""
    now = oom_kills()
    return max(now - before, 0) if now is not None and before is not None else 0


# A worker's oom_score_adj (-1000..1000; 0 by default): when memory runs out, the kernel's OOM killer then
# picks a worker before the launcher, which can say what happened, mark the run failed and end the others.
WORKER_OOM_SCORE_ADJ = 500


def prefer_as_oom_victim(adj: int = WORKER_OOM_SCORE_ADJ, path: str = "/proc/self/oom_score_adj") -> None:
    """Raise this process's oom_score_adj to `adj` (never lower it; raising needs no privilege)."""
    with suppress(OSError, ValueError):
        with open(path) as f:
            current = int(f.read())
        if current < adj:
            with open(path, "w") as f:
                f.write(str(adj))
