"""A worker that torchrun started: it ends when torchrun's agent dies, and leaves a mark while it runs so
that the others can name a worker that died without a word (SIGKILL, the OOM killer)."""

import atexit
import os
import select
import shutil
import signal
import tempfile
import threading
import time
from contextlib import suppress
from pathlib import Path

from psgd.io import write_atomic
from psgd.process import oom_kills, proc_stat, process_tag

_agent_watched = False
agent_gone = False  # stop_with_agent found torchrun's agent gone
TORCHRUN_MARKS = "psgd-torchrun-"  # temp folder of a torchrun job's marks: + the agent's tag, the attempt
_marked = False
oom_kills_at_mark: int | None = None  # the kernel's OOM-kill count when this torchrun worker marked itself


def stop_with_agent() -> None:
    """In a worker that torchrun started: SIGTERM to itself when torchrun's agent, its parent, dies
    (the OOM killer, kill -9): torchrun gives its workers no parent-death signal."""
    global _agent_watched
    if _agent_watched:
        return
    _agent_watched = True
    agent = os.getppid()
    try:  # readable the moment the agent exits, so every worker of the machine stops at once (Linux >= 5.3)
        exited = os.pidfd_open(agent)
    except (AttributeError, OSError):
        exited = None

    def watch() -> None:
        global agent_gone
        if exited is not None:
            select.select([exited], [], [])
        while os.getppid() == agent:  # without a pidfd: polled
            time.sleep(0.5)
        agent_gone = True
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="psgd-agent-watch", daemon=True).start()


def _torchrun_marks() -> tuple[Path, int] | None:
    """In a worker that torchrun started: the folder of this job attempt's marks on this machine, and
    this worker's local rank; else None."""
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
    """In a worker that torchrun started, once: leave a mark (a file named by the local rank, holding the pid)
    that says "ended" once this process exits in any way Python sees; one that does not (SIGKILL, the OOM
    killer) is found by `torchrun_workers_gone`. The last worker out takes the marks away."""
    global oom_kills_at_mark, _marked
    where = _torchrun_marks()
    if where is None or _marked:
        return
    _marked = True
    oom_kills_at_mark = oom_kills()
    folder, local_rank = where
    agent, me = os.getppid(), os.getpid()
    with suppress(OSError):
        write_atomic(folder / str(local_rank), str(me))  # whole: a reader never sees half of it

        def ended() -> None:
            with suppress(OSError):
                write_atomic(folder / str(local_rank), f"{me} ended")
            if not any(_running(pid, agent) and not done for pid, done in _marks(folder).values()):
                shutil.rmtree(folder, ignore_errors=True)

        atexit.register(ended)


def wait_for_this_machines_workers(within_s: float) -> None:
    """In a worker that torchrun started, before it removes the run dir this machine's workers share: wait
    (at most `within_s`, or until a signal) until each is marked, that is, past Hydra's set-up of that dir."""
    where = _torchrun_marks()
    if where is None:
        return
    workers = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    deadline = time.monotonic() + within_s
    with suppress(KeyboardInterrupt):  # the agent stops this worker, or Ctrl-C: wait no more
        while len(_marks(where[0])) < workers and time.monotonic() < deadline:
            time.sleep(0.05)


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
    """Whether process `pid` is a child of `parent` that has not exited (a zombie has)."""
    fields = proc_stat(pid)
    return len(fields) > 1 and fields[1] == str(parent) and fields[0] not in ("Z", "X", "x")


def torchrun_workers_gone() -> tuple[list[int], list[int]]:
    """In a worker that torchrun started: (the global ranks of this machine's workers that died without a
    word, the global ranks of the others here, this one's included); ([], []) elsewhere."""
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
