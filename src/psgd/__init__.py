"""psgd: parallel SGD (DDP, model averaging, local SGD, HogWild) with PyTorch Lightning and Hydra."""

__version__ = "0.1.0"

import logging
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from psgd.signals import LAUNCHER_ENV, prefer_as_oom_victim

if os.environ.get(LAUNCHER_ENV, str(os.getpid())) != str(os.getpid()):
    # a process that psgd's launcher started (a worker, or HogWild's fork server), as early as it
    # imports psgd, before torch: workers starting at once can run a machine out of memory, and the
    # kernel must then kill one of them, not the launcher that can say so and mark the run failed
    prefer_as_oom_victim()

# Lightning 2.6 calls a torch pytree API that torch 2.14 deprecates; harmless, and printed by every worker.
warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")


class _Noise(logging.Filter):
    """Drops one library's log line that says nothing to a psgd user, in every run's output."""

    def __init__(self, start: str):
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.start)


# Lightning 2.6 prints a tip to install its cloud logger (litlogger) whenever a Trainer is made without it;
# psgd logs to TensorBoard
logging.getLogger("pytorch_lightning.utilities.rank_zero").addFilter(_Noise("💡 Tip: For seamless cloud logging"))
# compile=true on CPU: inductor's C++ builder, on a CUDA build of torch where no CUDA runtime is (a CPU
# machine), says so in every worker; nothing a CPU run needs
logging.getLogger("torch.utils.cpp_extension").addFilter(_Noise("No CUDA runtime is found"))

QUIET_ENV = "PSGD_QUIET"  # set by a quiet run for its worker processes, which import psgd when they start
LIGHTNING_LOGGERS = ("pytorch_lightning", "lightning_fabric", "lightning")


def quiet_lightning() -> None:
    """No Lightning info lines ("Initializing distributed", banners) and no advisory warnings."""
    os.environ[QUIET_ENV] = "1"
    # import first: importing Lightning sets its loggers to INFO, which would undo the levels set here
    import pytorch_lightning  # noqa: F401
    from lightning_fabric.utilities.warnings import PossibleUserWarning

    for name in LIGHTNING_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)

    warnings.filterwarnings("ignore", category=PossibleUserWarning)


@contextmanager
def quietness(quiet: bool) -> Iterator[None]:
    """Quiet (or not) for one run: afterwards the caller's Lightning log levels, warning filters and
    PSGD_QUIET are what they were, so a notebook or test that runs a quiet job and then a normal one
    sees the normal one's output."""
    import pytorch_lightning  # noqa: F401  (sets its loggers' levels on first import: read them after)

    levels = {name: logging.getLogger(name).level for name in LIGHTNING_LOGGERS}
    env = os.environ.get(QUIET_ENV)
    with warnings.catch_warnings():  # restores the filters on the way out
        if quiet:
            quiet_lightning()  # here and, through the environment, in every worker process
        else:
            os.environ.pop(QUIET_ENV, None)
        try:
            yield
        finally:
            for name, level in levels.items():
                logging.getLogger(name).setLevel(level)
            if env is None:
                os.environ.pop(QUIET_ENV, None)
            else:
                os.environ[QUIET_ENV] = env


if os.environ.get(QUIET_ENV) == "1":
    quiet_lightning()
