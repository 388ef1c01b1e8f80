"""Where a run writes: the name of its dir (the `psgd_run_name` resolver of conf/train.yaml, alike in every
process of a torchrun / srun job), whether a dir can take its results, and whether it holds an earlier one's.
A leaf: the standard library, OmegaConf and psgd's leaves only."""

import json
import os
import tempfile
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path

from omegaconf import OmegaConf

from psgd.console import torchrun_worker
from psgd.overrides import shell_override
from psgd.process import proc_stat


def process_start(pid: int) -> datetime | None:
    """When process `pid` started (Linux: /proc), or None where that cannot be read."""
    try:
        ticks = int(proc_stat(pid)[19])  # field 22, starttime
        boot = next(ln for ln in Path("/proc/stat").read_text().splitlines() if ln.startswith("btime "))
        return datetime.fromtimestamp(int(boot.split()[1]) + ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def job_start(env: Mapping[str, str]) -> datetime | None:
    """When this torchrun / srun job started, alike in all of its processes and in a worker torchrun
    restarts hours later: srun's SLURM_JOB_START_TIME (a Unix time, the same on every node), or the
    start of torchrun's agent, the workers' parent on each machine. None where neither can be read."""
    if torchrun_worker():
        return process_start(os.getppid())
    try:
        return datetime.fromtimestamp(int(env["SLURM_JOB_START_TIME"]))
    except (KeyError, ValueError, OverflowError, OSError):
        return None


def run_name() -> str:
    """The run dir under outputs/: <date>/<time>, or a name every process of one torchrun / srun job
    computes alike, so that all workers (and a restarted worker) write into the same dir. Its date is
    the job's start (job_start), not today's: a worker that started, or was restarted, after midnight
    files itself with the run it belongs to."""
    env = os.environ
    if torchrun_worker():
        started = job_start(env)
        day = (started or datetime.now()).strftime("%Y-%m-%d")
        run_id = env["TORCHELASTIC_RUN_ID"]
        if run_id not in ("", "none"):  # --rdzv-id, or the id torchrun makes up for one machine
            return f"{day}/torchrun-{run_id}"
        # "none": a static rendezvous (--master-port given). On one machine every worker, restarted
        # ones too, is a child of the one torchrun process: its pid and start time name this job (the
        # port alone would name every such job of the day alike). Across machines, only the port.
        if started is not None and env.get("WORLD_SIZE") == env.get("LOCAL_WORLD_SIZE"):
            return started.strftime(f"%Y-%m-%d/%H-%M-%S-torchrun{os.getppid()}")
        return f"{day}/torchrun-port{env.get('MASTER_PORT', '')}"
    if "SLURM_JOB_ID" in env and "SLURM_STEP_ID" in env and int(env.get("SLURM_NTASKS") or 1) > 1:
        # srun's tasks (one per worker); one task, e.g. `python train.py` lines in a batch script, has
        # no other process to agree with and gets a name of its own, as anywhere
        day = (job_start(env) or datetime.now()).strftime("%Y-%m-%d")
        return f"{day}/slurm-{env['SLURM_JOB_ID']}.{env['SLURM_STEP_ID']}"
    return datetime.now().strftime("%Y-%m-%d/%H-%M-%S-%f")


# conf/train.yaml's hydra.run.dir: `${psgd_run_name:}`, resolvable wherever a run's config is (a SLURM job's
# process too), so registered as this module loads: psgd.run and the scripts import it
OmegaConf.register_new_resolver("psgd_run_name", run_name, use_cache=True, replace=True)


# the nearest folder of the run's (or sweep's) output dir that existed when output_problem checked it: a run
# that fails before training takes away the folders below it that it left empty (None: not checked)
existed: Path | None = None


def output_problem(out: Path, key: str) -> str | None:
    """Why results cannot be written to `out` (the dir Hydra will make, set by `key`), or None: a folder
    cannot be made in its nearest existing ancestor."""
    global existed
    existed = out.absolute()
    while not existed.exists() and existed != existed.parent:
        existed = existed.parent
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".psgd-write-check-", dir=existed))
    except OSError as e:
        return f"cannot write results to {out}: {e.strerror or e} in {existed}; set PSGD_OUTPUTS=<dir> or {key}=<dir>"
    return None


def earlier_results(out: Path, key: str) -> str | None:
    """Why `out` cannot take this run: it holds an earlier run's record (metrics.json) or sweep's
    (report.md, job records; with key "hydra.sweep.dir"), which this one would overwrite. None if it
    holds none, or for a worker that torchrun restarted, which goes on in its job's dir. `key` names
    what the user sets to choose another dir (hydra.run.dir, or train()'s run_dir)."""
    fix = f"set {key} to a new folder, or delete that one"
    if key == "hydra.sweep.dir":
        jobs = len(list(out.glob("**/metrics.json")))  # <n>/, or folders a changed hydra.sweep.subdir names
        held = [f"{jobs} job record(s)"] if jobs else []
        held += ["report.md"] if (out / "report.md").exists() else []
        if not held:
            return None
        return f"{out} holds an earlier sweep's results ({', '.join(held)}), which this sweep would overwrite: {fix}"
    record = out / "metrics.json"
    if not record.is_file() or int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0) > 0:
        return None
    try:
        status = json.loads(record.read_text()).get("status", "unknown")
    except (OSError, ValueError, AttributeError):
        status = "unreadable"
    return (
        f"{out} holds an earlier run's results (metrics.json: {status}), which this run would overwrite: {fix} "
        f"({shell_override('ckpt_path', out)} resumes that run in a new folder)"
    )
