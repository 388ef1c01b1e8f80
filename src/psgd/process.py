"""What a run sets in its process: Lightning's quietness, filters of library noise, a worker's OOM score.

Nothing here acts on import. A run wraps its work in `run_settings`, which restores everything on the way
out; each worker process that psgd's launcher starts calls `prepare_worker` first.
"""

import logging
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from psgd.signals import prefer_as_oom_victim

QUIET_ENV = "PSGD_QUIET"  # "1" while a quiet run runs: its worker processes inherit it
LIGHTNING_LOGGERS = ("pytorch_lightning", "lightning_fabric", "lightning")


class _Noise(logging.Filter):
    """Drops a library's log line that says nothing to a psgd user."""

    def __init__(self, start: str):
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.start)


_NOISE = {
    # Lightning's tip to install its cloud logger (litlogger), printed whenever a Trainer is made: psgd logs to
    # TensorBoard
    "pytorch_lightning.utilities.rank_zero": _Noise("💡 Tip: For seamless cloud logging"),
    # compile=true on a CPU machine with a CUDA build of torch: inductor's C++ builder says so in every worker
    "torch.utils.cpp_extension": _Noise("No CUDA runtime is found"),
}


def filter_library_noise() -> None:
    """Filter the warnings and log lines of Lightning and torch that a psgd user can do nothing about."""
    # Lightning calls a torch pytree API that torch deprecates; harmless, and printed by every worker
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")
    for name, noise in _NOISE.items():
        logging.getLogger(name).addFilter(noise)


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
    """The process's settings for one run: library noise filtered, Lightning quiet (or not), here and, through
    PSGD_QUIET, in every worker process. Afterwards the caller's log levels and filters, warning filters and
    PSGD_QUIET are what they were, so a notebook or test that runs a quiet job and then a normal one sees the
    normal one's output."""
    import pytorch_lightning  # noqa: F401  (sets its loggers' levels on first import: read them after)

    levels = {name: logging.getLogger(name).level for name in LIGHTNING_LOGGERS}
    env = os.environ.get(QUIET_ENV)
    with warnings.catch_warnings():  # restores the warning filters on the way out
        filter_library_noise()
        if quiet:
            os.environ[QUIET_ENV] = "1"
            quiet_lightning()
        else:
            os.environ.pop(QUIET_ENV, None)
        try:
            yield
        finally:
            for name, noise in _NOISE.items():
                logging.getLogger(name).removeFilter(noise)
            for name, level in levels.items():
                logging.getLogger(name).setLevel(level)
            if env is None:
                os.environ.pop(QUIET_ENV, None)
            else:
                os.environ[QUIET_ENV] = env


def prepare_worker() -> None:
    """First thing in a worker process that psgd's launcher started (spawned or forked by the fork server):
    offer it to the kernel's out-of-memory killer before the launcher (which can then say what happened and
    end the others), filter library noise, and be quiet where the run is."""
    prefer_as_oom_victim()
    filter_library_noise()
    if os.environ.get(QUIET_ENV) == "1":
        quiet_lightning()
