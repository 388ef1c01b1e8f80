"""The errors psgd reports to a user as one line, each defined here: a leaf, importing nothing of psgd (nor torch:
the scripts raise ConfigError before torch loads)."""

import os
import signal
from pathlib import Path


class ConfigError(ValueError):
    """A bad configuration value; str() is the one-line message shown to the user."""


class DirInUse(ConfigError):
    """The run dir holds an earlier run's results: nothing may be written there, not even a failure."""


class DataError(RuntimeError):
    """A dataset that is missing, truncated or corrupted; the message is one line with the fix."""


class TrainingDiverged(RuntimeError):
    """The training loss became NaN or infinite; str() is the one-line message shown to the user."""


class KilledWorker(RuntimeError):
    """A worker that died of SIGKILL, its message the run's one line naming it and why. `error_index` (its rank),
    `error_pid`, `exit_code` and `signal_name` as torch's ProcessExitedException has them. Picklable (a sweep
    launcher returns it from another process)."""

    exit_code, signal_name = -signal.SIGKILL, "SIGKILL"

    def __init__(self, message: str, rank: int, pid: int):
        super().__init__(message)
        self.msg, self.error_index, self.error_pid = message, rank, pid

    def __reduce__(self):
        return type(self), (self.msg, self.error_index, self.error_pid)


class WorkerGone(RuntimeError):
    """Under torchrun: workers on this machine died without an error of their own (SIGKILL, a crash).
    str() is the line a user sees. `says_so`: this worker prints it (the lowest rank left here);
    `records`: it also marks metrics.json failed (rank 0, or the one saying so where rank 0 died)."""

    def __init__(self, ranks: list[int], survivors: list[int], run_dir: Path, oom_kills: int):
        rank, self.ranks = int(os.environ.get("RANK", "0")), ranks
        self.says_so = rank == survivors[0]
        self.records = rank == 0 or (0 in ranks and self.says_so)
        which = f"worker rank {ranks[0]}" if len(ranks) == 1 else f"worker ranks {', '.join(map(str, ranks))}"
        if oom_kills > 0:
            why = (
                f"killed by the kernel's out-of-memory killer (its OOM-kill count rose by {oom_kills} during the "
                "run): use fewer workers per machine or a smaller data.batch_size"
            )
        else:
            why = "the process ended without an error of its own: a signal or a crash; torchrun's summary says which"
        super().__init__(f"{which} died ({why}); results of finished epochs are in {run_dir}")
