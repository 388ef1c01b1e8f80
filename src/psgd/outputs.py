"""Where a run writes: the name of its dir (the `psgd_run_name` resolver of conf/train.yaml, alike in every
process of a torchrun / srun job), whether a dir can take its results, and whether it holds an earlier one's.
A leaf: the standard library, OmegaConf and psgd's leaves only."""

import os
import tempfile
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


def run_name() -> str:
    """The run dir under outputs/, before its label: <date>/<time>, or a name every process of one torchrun / srun job
    computes alike, so that all workers (and one torchrun restarts, also after midnight) write into one dir:
    the job's id under its start date, or on one machine with a static rendezvous torchrun's start and pid."""
    env = os.environ
    if torchrun_worker():
        started = process_start(os.getppid())  # torchrun's agent: the parent of every worker of its machine
        day = (started or datetime.now()).strftime("%Y-%m-%d")
        if env["TORCHELASTIC_RUN_ID"] not in ("", "none"):  # --rdzv-id, or the id torchrun makes up for one machine
            return f"{day}/torchrun-{env['TORCHELASTIC_RUN_ID']}"
        if started is not None and env.get("WORLD_SIZE") == env.get("LOCAL_WORLD_SIZE"):  # not the port alone:
            return started.strftime(f"%Y-%m-%d/%H-%M-%S-torchrun{os.getppid()}")  # it names the day's jobs alike
        return f"{day}/torchrun-port{env.get('MASTER_PORT', '')}"
    if "SLURM_STEP_ID" in env and int(env.get("SLURM_NTASKS") or 1) > 1:  # srun's tasks; one task is a run alone
        start = env.get("SLURM_JOB_START_TIME")  # the same on every node
        day = datetime.fromtimestamp(int(start)) if start else datetime.now()
        return day.strftime(f"%Y-%m-%d/slurm-{env.get('SLURM_JOB_ID')}.{env['SLURM_STEP_ID']}")
    return datetime.now().strftime("%Y-%m-%d/%H-%M-%S-%f")


def run_label(strategy: str, workers: int, devices: int | None) -> str:
    """What a run dir's (and a sweep job dir's) name says of the run besides when: `model_averaging_x2`."""
    return f"{strategy}_x{devices or workers}"


# conf/train.yaml's hydra.run.dir (`${psgd_run_name:}_${psgd_run_label:...}`) and hydra.sweep.subdir, resolvable
# wherever a run's config is (a SLURM job's process too), so registered as this module loads: psgd.run and the
# scripts import it
OmegaConf.register_new_resolver("psgd_run_name", run_name, use_cache=True, replace=True)
OmegaConf.register_new_resolver("psgd_run_label", run_label, replace=True)


# the nearest folder of the run's (or sweep's) output dir that existed when output_problem checked it: a run
# that fails before training takes away the folders below it that it left empty (None: not checked)
existed: Path | None = None


def output_problem(out: Path, key: str) -> str | None:
    """Why results cannot be written to `out` (set by `key`): no folder can be made in its nearest existing one."""
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
    """Why `out` (set by `key`) cannot take this run: it holds an earlier run's metrics.json or sweep's records
    (key "hydra.sweep.dir"), which this one would overwrite; None too for a worker torchrun restarted."""
    fix = f"set {key} to a new folder, or delete that one"
    if key == "hydra.sweep.dir":  # job records in <n>/, or in folders a changed hydra.sweep.subdir names
        if any(out.glob("**/metrics.json")) or (out / "report.md").exists():
            return f"{out} holds an earlier sweep's results, which this sweep would overwrite: {fix}"
        return None
    if not (out / "metrics.json").is_file() or int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0) > 0:
        return None
    return (
        f"{out} holds an earlier run's results (metrics.json), which this run would overwrite: {fix} "
        f"({shell_override('ckpt_path', out)} resumes that run in a new folder)"
    )
