"""What psgd says on stderr (`psgd: error: ...`) and which process of a run says it.
A leaf: the standard library and psgd's leaves only."""

import os
import re
import time

from psgd.io import say
from psgd.overrides import as_typed

# how long a torchrun worker waits for its agent's SIGTERM once the first worker has said the problem
AGENT_STOPS_WITHIN_S = 10.0


def global_rank() -> str | None:
    """This process's global rank when torchrun or srun started it as one of the workers, else None."""
    return os.environ.get("RANK", os.environ.get("SLURM_PROCID"))


def first_worker() -> bool:
    """This process speaks for the run: it is no worker torchrun or srun started, or it is rank 0 of them."""
    return global_rank() in (None, "0")


def torchrun_worker() -> bool:
    """This process is one of the workers that torchrun (torch elastic) started."""
    return "TORCHELASTIC_RUN_ID" in os.environ and "RANK" in os.environ


def other_torchrun_worker() -> bool:
    """A worker that torchrun started other than the first on its machine (local rank 0)."""
    return torchrun_worker() and os.environ.get("LOCAL_RANK", "0") != "0"


def fail(message: str, every_worker_finds_it: bool = False) -> None:
    """A user error: one line on stderr, exit code 2. If `every_worker_finds_it` (under torchrun each worker
    of a machine finds it), a worker other than the machine's first waits for the agent's SIGTERM (once the
    first has exited) and says nothing, or says it too when none came in time."""
    if every_worker_finds_it and other_torchrun_worker():
        try:
            time.sleep(AGENT_STOPS_WITHIN_S)
        except KeyboardInterrupt:
            raise SystemExit(2) from None
    say(f"psgd: error: {message}")
    raise SystemExit(2)


def text_lines(text: object) -> list[str]:
    """The non-blank lines of a (multi-line) message, stripped; never empty. An error raised inside a torch
    future's callback (DDP's comm hook) reads as its own message: torch adds a prefix and, after "At:", the
    callback's frames."""
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    if "At:" in lines:
        lines = lines[: lines.index("At:")]
    lines = [re.sub(r"(Got the following error when running the callback: )+\w+: ", "", ln) for ln in lines]
    return lines or ["unknown error"]


def in_the_job(problem: object, job: list[str], jobs: list[list[str]]) -> str:
    """`problem`, naming the sweep's job it is in by its swept values (the overrides not every job has)."""
    values = " ".join(as_typed(o) for o in job if not all(o in other for other in jobs))
    return f"{problem} (in the job {values or 'of the defaults'}; no job was started)"
