"""The fork server that starts psgd's worker processes on CPU (strategy.start_method=forkserver, null's
choice there): it imports torch, Lightning and psgd once (PRELOAD) and forks each worker already loaded,
without ever running a torch operation (GNU OpenMP's threads do not survive a fork of a process that used
them). The scripts start it early, before they import torch themselves, so this module stays light.
"""

import multiprocessing
import os
import signal
from collections.abc import Iterable
from contextlib import suppress
from multiprocessing import forkserver
from pathlib import Path
from typing import Any

# what every worker needs, imported once in the server before it forks any worker; last, the server's quick exit
PRELOAD = ("torch", "pytorch_lightning", "psgd.run", "psgd.strategies.registry", "psgd._in_forkserver")


def available() -> bool:
    """This platform has fork servers (Linux, macOS; not Windows)."""
    return "forkserver" in multiprocessing.get_all_start_methods()


def start() -> None:
    """Start the server unless it runs (a dead one is replaced). It ignores Ctrl-C, which is the launcher's
    to handle; each worker takes the launcher's SIGINT handling when it starts (launcher_state)."""
    if not available():
        return
    multiprocessing.set_forkserver_preload(list(PRELOAD))
    sigint = signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited by the server (ignored stays ignored)
    try:
        forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGINT, sigint)


def will_use_server(run: Any) -> bool:
    """Whether psgd will start the workers of `run` (a checked psgd.config.Run) from the fork server, as far as
    can be told before torch loads (psgd.config.resolve_start_method decides with torch)."""
    s = run.strategy
    if s.runs_in_this_process(run) or run.trainer.num_nodes != 1:
        return False
    torchrun = {"TORCHELASTIC_RUN_ID", "RANK"} <= os.environ.keys()
    if torchrun or int(os.environ.get("SLURM_NTASKS") or 1) > 1:  # torchrun or srun starts the workers
        return False
    if s.cpu_only:
        return s.resolved_start_method("cpu", available()) == "forkserver"
    if s.start_method not in (None, "forkserver"):
        return False
    accelerator = run.trainer.accelerator
    # an NVIDIA driver's device node, without importing torch: a hint, not CUDA's own answer
    gpu = Path("/dev/nvidiactl").exists() and os.environ.get("CUDA_VISIBLE_DEVICES") not in ("", "-1")
    return accelerator == "cpu" or (accelerator in (None, "auto") and not gpu)


def runs_jobs_here(first_job: Any) -> bool:
    """Hydra's basic launcher runs the jobs in this process; another (submitit on SLURM) runs them
    elsewhere, where they start their own server. `first_job`: composed with Hydra's node."""
    from omegaconf import OmegaConf

    launcher = str(OmegaConf.select(first_job, "hydra.launcher._target_", default="") or "")
    return launcher == "" or launcher.endswith(".BasicLauncher")


def start_early(first_job: Any, runs: Iterable[Any]) -> None:
    """Start the server now if any of these checked runs will need it: a head start, so nothing is raised
    (the first launch starts it otherwise), and a server that no job uses only sleeps until this process exits.
    `first_job`: the first job composed with Hydra's node."""
    with suppress(Exception):
        if available() and runs_jobs_here(first_job) and any(will_use_server(run) for run in runs):
            start()


def launcher_state() -> dict[str, Any]:
    """What a fork-server child takes over from its launcher, as a spawned worker would inherit it: the
    environment and whether SIGINT is ignored (a background job)."""
    return {"environ": dict(os.environ), "sigint_ignored": signal.getsignal(signal.SIGINT) is signal.SIG_IGN}


def adopt_launcher_state(state: dict[str, Any]) -> None:
    """In a worker the fork server started: take the launcher's state (launcher_state)."""
    os.environ.clear()
    os.environ.update(state["environ"])
    signal.signal(signal.SIGINT, signal.SIG_IGN if state["sigint_ignored"] else signal.default_int_handler)
