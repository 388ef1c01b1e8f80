"""What psgd says on stderr (`psgd: error: ...`, `psgd: warning: ...`), which process of a run says it, and
overrides written as a user types them. A leaf: the standard library and psgd's leaves only."""

import os
import re
import shlex
import time

from psgd.results import say


def global_rank() -> str | None:
    """This process's global rank when torchrun or srun started it as one of the workers, else None."""
    return os.environ.get("RANK", os.environ.get("SLURM_PROCID"))


def first_worker() -> bool:
    """This process speaks for the run: it is not one of several workers that torchrun or srun started
    as train.py processes, or it is rank 0 of them (each finds the same settings, files and results)."""
    return global_rank() in (None, "0")


def torchrun_worker() -> bool:
    """This process is one of the workers that torchrun (torch elastic) started."""
    return "TORCHELASTIC_RUN_ID" in os.environ and "RANK" in os.environ


def other_torchrun_worker() -> bool:
    """A worker that torchrun started other than the first on its machine (local rank 0)."""
    return torchrun_worker() and os.environ.get("LOCAL_RANK", "0") != "0"


# how long a torchrun worker waits for its agent's SIGTERM once the first worker has said the problem
AGENT_STOPS_WITHIN_S = 10.0


def leave_it_to_the_first() -> bool:
    """In a torchrun worker other than its machine's first, which found the same problem as that one:
    wait for the agent to stop this worker (it sends SIGTERM to the others once one has exited), so that
    the first worker says it, once. True when stopped so; False elsewhere, or when no SIGTERM came in
    time (then this worker says it too). Needs SIGTERM raised as KeyboardInterrupt
    (signals.interrupt_on_sigterm)."""
    if not other_torchrun_worker():
        return False
    try:
        time.sleep(AGENT_STOPS_WITHIN_S)
    except KeyboardInterrupt:
        return True
    return False


def fail(message: str, every_worker_finds_it: bool = False) -> None:
    """A user error: one line on stderr, exit code 2.

    Args:
        every_worker_finds_it: the line follows from the config and the machine alone, so under torchrun
            each worker of a machine finds it: the first one says it (leave_it_to_the_first).
    """
    if not (every_worker_finds_it and leave_it_to_the_first()):
        say(f"psgd: error: {message}")
    raise SystemExit(2)


# while a sweep runs its jobs in this process: the warnings said so far, each said for its first job only
_SAID_IN_SWEEP: set[str] | None = None


def warn_once_per_sweep(on: bool) -> None:
    """From now on (on=True) until off, a warning said by one job of the sweep is not said again."""
    global _SAID_IN_SWEEP
    _SAID_IN_SWEEP = set() if on else None


def warn(message: str) -> None:
    """A `psgd: warning: ...` line on stderr, said once per run (first_worker), and once per sweep."""
    if not first_worker():
        return
    if _SAID_IN_SWEEP is not None:
        if message in _SAID_IN_SWEEP:
            return
        _SAID_IN_SWEEP.add(message)
    say(f"psgd: warning: {message}")


def text_lines(text: object) -> list[str]:
    """The non-blank lines of a (multi-line) message, stripped; never empty."""
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    return lines or ["unknown error"]


def override_key(text: str) -> str:
    """The key an override sets (`+data.seed=1` -> data.seed; a flag is its own key)."""
    return text.split("=", 1)[0].lstrip("+~")


def as_typed(override: str) -> str:
    """An override as its user typed it: Hydra's sweeper escapes special characters in a job's string
    values (`trainer.max_time=00\\:00\\:01\\:00`), which a line or a report shows without."""
    key, sep, value = override.partition("=")
    return key + sep + re.sub(r"\\([\\()\[\]{}:=, \t])", r"\1", value)


def shell_override(key: str, value: object) -> str:
    """`key=value` as one shell word that Hydra reads back as the string `value` (a path with a space,
    a non-ASCII letter or a #: quoted for both)."""
    text = str(value)
    if re.fullmatch(r"[\w/.+:@%-]+", text, re.ASCII) and not text.startswith("~"):
        return f"{key}={text}"
    if not any(c in text for c in "'\"$`\\!"):  # no character the two quotings would take as their own
        return f"\"{key}='{text}'\""
    # Hydra's escapes in a quoted value: \' for a quote, \\ for a backslash before a quote or at the end
    escaped = re.sub(r"(\\+)(?='|$)", lambda m: m[1] * 2, text).replace("'", "\\'")
    return shlex.quote(f"{key}='{escaped}'")


# what a continued sweep adds to its command line: continue_sweep left out of `${hydra.job.override_dirname}`
NOT_IN_DIR_NAMES = "hydra.job.config.override_dirname.exclude_keys=[continue_sweep]"


def in_the_job(problem: object, job: list[str], jobs: list[list[str]]) -> str:
    """`problem`, naming the job of a sweep it is in by the job's swept values (its overrides that not
    every job has)."""
    values = " ".join(as_typed(o) for o in job if not all(o in other for other in jobs))
    return f"{problem} (in the job {values or 'of the defaults'}; no job was started)"


def gpus_by_id(ids: list[str]) -> str | None:
    """psgd's way to what Lightning's trainer.devices=[0,1] does (psgd's trainer.devices is a count),
    where `ids` are device ids (digits); else None."""
    if not ids or not all(i.isdigit() for i in ids):
        return None
    return (
        "to train on particular GPUs, make only those visible: "
        f"CUDA_VISIBLE_DEVICES={','.join(ids)} python train.py trainer.accelerator=gpu workers={len(ids)}"
    )
