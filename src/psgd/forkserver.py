"""The fork server that starts psgd's worker processes on CPU (strategy.start_method=forkserver, what
null resolves to there).

A spawned worker is a fresh interpreter that imports torch, Lightning and psgd before it can train, and
workers starting at once import at once. The fork server imports all of that once (PRELOAD) and forks each
worker from itself, already loaded. The server never runs a torch operation, so its children can use
OpenMP, which a worker forked from the launcher cannot once the launcher has run one (GNU OpenMP's thread
pool does not survive a fork). It lives as long as the process that started it; a sweep's jobs share it.

The scripts start it as soon as the command line is checked (`start_early`), so that it imports while the
launcher itself imports; otherwise the first launch starts it. This module stays light (the standard
library, psgd.signals, OmegaConf): the scripts import it before torch.
"""

import multiprocessing
import os
import signal
import time
from collections.abc import Iterable
from multiprocessing import forkserver
from pathlib import Path
from typing import Any

from psgd.process import proc_stat

# what every worker needs, imported once in the server before it forks any worker; last, the server's quick exit
PRELOAD = ("torch", "pytorch_lightning", "psgd.run", "psgd._in_forkserver")


def available() -> bool:
    """This platform has fork servers (Linux, macOS; not Windows)."""
    return "forkserver" in multiprocessing.get_all_start_methods()


def start() -> None:
    """Start the server unless it runs (multiprocessing keeps one per process; a dead one is replaced).
    It ignores Ctrl-C (SIGINT) from the start, also while it imports: Ctrl-C is the launcher's to handle,
    and a server stopped in an import would print its traceback; each worker takes the launcher's SIGINT
    handling when it starts (launcher_state). The server keeps the launcher's standing with the
    out-of-memory killer (only its workers offer themselves first: psgd.process.prepare_worker), since its
    death ends every worker's run."""
    if not available():
        return
    multiprocessing.set_forkserver_preload(list(PRELOAD))
    sigint = signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited by the server (ignored stays ignored)
    try:
        forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGINT, sigint)


def nvidia_gpu_present() -> bool:
    """An NVIDIA driver's device node is here (without importing torch: a hint, not CUDA's own answer)."""
    return Path("/dev/nvidiactl").exists() and os.environ.get("CUDA_VISIBLE_DEVICES", None) not in ("", "-1")


def will_use_server(cfg: Any) -> bool:
    """Whether psgd will start this checked job's workers from the fork server, as far as can be told
    before torch loads (psgd.config.resolve_start_method decides with torch): workers started by psgd (not
    torchrun / srun), with strategy=hogwild or, on CPU, start_method forkserver or null. Model averaging
    and HogWild start a worker process even for workers=1; DDP trains one worker in this process."""
    s, trainer = cfg.strategy, cfg.trainer
    in_process = s.name == "ddp" and not s.get("ddp_for_one_worker", False)
    workers = trainer.get("devices") or cfg.workers  # (as psgd.config.resolve_workers, on a checked config)
    if workers < (2 if in_process else 1) or trainer.get("num_nodes", 1) != 1:
        return False
    torchrun = {"TORCHELASTIC_RUN_ID", "RANK"} <= os.environ.keys()
    if torchrun or int(os.environ.get("SLURM_NTASKS") or 1) > 1:  # torchrun or srun starts the workers
        return False
    if s.name == "hogwild":
        return True
    if s.get("start_method") not in (None, "forkserver"):
        return False
    accelerator = trainer.get("accelerator")
    return accelerator == "cpu" or (accelerator in (None, "auto") and not nvidia_gpu_present())


def runs_jobs_here(first_job: Any) -> bool:
    """Hydra's basic launcher runs the jobs in this process; another (submitit on SLURM) runs them
    elsewhere, where they start their own server. `first_job`: composed with Hydra's node."""
    from omegaconf import OmegaConf

    launcher = str(OmegaConf.select(first_job, "hydra.launcher._target_", default="") or "")
    return launcher == "" or launcher.endswith(".BasicLauncher")


def start_early(jobs: Iterable[tuple[list[str], Any]]) -> None:
    """Start the server now if any of these composed jobs will need it: its imports then run while this
    process imports torch for the job. A server that no job
    uses in the end (a GPU took the job: spawn) only sleeps until this process exits."""
    jobs = list(jobs)
    try:
        if not jobs or not available() or not runs_jobs_here(jobs[0][1]):
            return
        if any(will_use_server(cfg) for _, cfg in jobs):
            start()
    except Exception:  # only a head start: the first launch starts it otherwise
        pass


def server_died(wait_s: float = 2.0) -> int | None:
    """The pid of the fork server this process started, where it has died (the kernel's out-of-memory
    killer, a kill), else None. Its workers' exit codes then read 255 (multiprocessing cannot ask it).
    A dying process closes its files (which is how its workers were seen to end) a moment before it is
    a zombie: that is waited for, up to `wait_s`."""
    server = getattr(forkserver._forkserver, "_forkserver_pid", None)
    if server is None:
        return None
    deadline = time.monotonic() + wait_s
    while proc_stat(server)[:1] not in ([], ["Z"], ["X"]):
        if time.monotonic() > deadline:
            return None
        time.sleep(0.02)
    return server


def launcher_state() -> dict[str, Any]:
    """What a worker takes over from its launcher at launch, which a spawned worker would inherit and a
    fork-server child would not (it inherits the server's): the environment (MASTER_PORT, PSGD_QUIET, the
    launcher's pid) and whether SIGINT is ignored (a background job)."""
    return {"environ": dict(os.environ), "sigint_ignored": signal.getsignal(signal.SIGINT) is signal.SIG_IGN}


def adopt_launcher_state(state: dict[str, Any]) -> None:
    """In a worker the fork server started: take the launcher's state (launcher_state)."""
    os.environ.clear()
    os.environ.update(state["environ"])
    signal.signal(signal.SIGINT, signal.SIG_IGN if state["sigint_ignored"] else signal.default_int_handler)
