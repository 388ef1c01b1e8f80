"""This process: what a run sets in it (Lightning's quietness, library noise filtered, a worker's OOM score),
how a run's record names it, and the kernel's OOM-kill count. Nothing here acts on import: a run wraps its
work in `run_settings`, and each worker process that psgd's launcher starts calls `prepare_worker` first."""

import logging
import os
import socket
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

QUIET_ENV = "PSGD_QUIET"  # "1" while a quiet run runs: its worker processes inherit it
LIGHTNING_LOGGERS = ("pytorch_lightning", "lightning_fabric", "lightning")


NOISE = {  # a library's logger: how its lines that say nothing to a psgd user start
    "pytorch_lightning.utilities.rank_zero": "💡 Tip: For seamless cloud logging",  # whenever a Trainer is made
    "torch.utils.cpp_extension": "No CUDA runtime is found",  # compile=true on CPU with a CUDA build of torch
}


def _not_noise(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(tuple(NOISE.values()))


def filter_library_noise() -> None:
    """Filter the warnings and log lines of Lightning and torch that a psgd user can do nothing about."""
    # Lightning calls a torch pytree API that torch deprecates; harmless, and printed by every worker
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")
    for name in NOISE:
        logging.getLogger(name).addFilter(_not_noise)


def quiet_lightning() -> None:
    """No Lightning info lines ("Initializing distributed", banners) and no advisory warnings."""
    # import first: importing Lightning sets its loggers to INFO, which would undo the levels set here
    import pytorch_lightning  # noqa: F401
    from lightning_fabric.utilities.warnings import PossibleUserWarning

    for name in LIGHTNING_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", category=PossibleUserWarning)


@contextmanager
def run_settings(quiet: bool) -> Iterator[None]:
    """The process's settings for one run, here and (through PSGD_QUIET) in its worker processes: library
    noise filtered, Lightning quiet or not. Afterwards the log levels and filters, warning filters and
    PSGD_QUIET are what they were (a notebook's quiet run, then a normal one, shows the normal one's output)."""
    import pytorch_lightning  # noqa: F401  (sets its loggers' levels on first import: read them after)

    levels = {name: logging.getLogger(name).level for name in LIGHTNING_LOGGERS}
    env = os.environ.get(QUIET_ENV)
    with warnings.catch_warnings():  # restores the warning filters on the way out
        filter_library_noise()
        os.environ[QUIET_ENV] = "1" if quiet else "0"
        if quiet:
            quiet_lightning()
        try:
            yield
        finally:
            for name in NOISE:
                logging.getLogger(name).removeFilter(_not_noise)
            for name, level in levels.items():
                logging.getLogger(name).setLevel(level)
            if env is None:
                os.environ.pop(QUIET_ENV, None)
            else:
                os.environ[QUIET_ENV] = env


def prepare_worker() -> None:
    """First thing in a worker process that psgd's launcher started: offer it to the kernel's OOM killer before
    the launcher (which can then say what happened and end the others), filter noise, be quiet as the run is."""
    prefer_as_oom_victim()
    filter_library_noise()
    if os.environ.get(QUIET_ENV) == "1":
        quiet_lightning()


def proc_stat(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name (state first, the start time at index 19),
    or [] where there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def process_tag(pid: int) -> str:
    """`<pid>-<start time>`: names one process for as long as the machine runs (a pid is reused)."""
    fields = proc_stat(pid)
    return f"{pid}-{fields[19] if len(fields) > 19 else 0}"


def this_process() -> dict[str, str | int]:
    """This process as a run's record names it (`alive` finds it)."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "tag": process_tag(os.getpid())}


def alive(process: object) -> bool:
    """Whether the process a record names (`this_process`) still runs on this machine."""
    if not isinstance(process, dict) or process.get("host") != socket.gethostname():
        return False
    pid = process.get("pid")
    fields = proc_stat(pid) if isinstance(pid, int) else []
    return len(fields) > 19 and fields[0] != "Z" and f"{pid}-{fields[19]}" == process.get("tag")


def still_running(record: dict) -> bool:
    """Whether a run's record (metrics.json) is still being written: not finished, its process alive."""
    return record.get("status") in ("running", "trained") and alive(record.get("process"))


VMSTAT = "/proc/vmstat"


def oom_kills() -> int | None:
    """How many processes the kernel's OOM killer has killed since boot; None where it does not say."""
    try:
        with open(VMSTAT) as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def oom_kills_since(before: int | None) -> int:
    """By how many `oom_kills` rose since it was `before`; 0 where either is unknown."""
    now = oom_kills()
    return max(now - before, 0) if now is not None and before is not None else 0


def prefer_as_oom_victim(adj: int = 500, path: str = "/proc/self/oom_score_adj") -> None:
    """Raise this process's oom_score_adj (-1000..1000) to `adj`, never lowering it (raising needs no
    privilege): the kernel's OOM killer then picks a worker before its launcher."""
    with suppress(OSError, ValueError):
        with open(path) as f:
            current = int(f.read())
        if current < adj:
            with open(path, "w") as f:
                f.write(str(adj))
