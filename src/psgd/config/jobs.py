"""A command line's jobs judged before any starts: each job's values (no torch) wherever it will run,
and for a sweep run here each job's machine checks.
"""

import contextlib
import io
import shutil
from collections.abc import Callable

from omegaconf import DictConfig, OmegaConf

from psgd import forkserver
from psgd.config.rules import check, check_values
from psgd.console import in_the_job
from psgd.errors import ConfigError

Jobs = list[tuple[list[str], DictConfig]]  # (overrides, config) of each job, as psgd.command_line composes them


def values_problem(jobs: Jobs, name_the_job: bool) -> str | None:
    """The line of the first job's value `check_values` refuses (a value means the same on any machine), or
    None: the scripts' check before torch loads. `name_the_job`: add which job of a sweep it is."""
    return _first_problem(jobs, check_values, name_the_job)


def sweep_values_problem(jobs: Jobs) -> str | None:
    """The line of the first job `check` refuses, as the job itself will, before the first one starts; or None.
    Only where Hydra's launcher runs the jobs here: a job submitit runs on SLURM is checked there (on a machine
    without srun, submitit would fail with a traceback). `jobs`: the first with Hydra's node."""
    launcher = str(OmegaConf.select(jobs[0][1], "hydra.launcher._target_", default=""))
    if launcher.endswith(".SlurmLauncher") and shutil.which("srun") is None:  # what submitit looks for
        choice = OmegaConf.select(jobs[0][1], "hydra.runtime.choices", default={}).get("hydra/launcher")
        return (
            f"hydra/launcher={choice or 'submitit_slurm'} submits each job to SLURM, and this machine has no "
            "srun on its PATH: run the sweep on a SLURM login node, or leave hydra/launcher out to run the "
            "jobs here"
        )
    if not forkserver.runs_jobs_here(jobs[0][1]):
        return None
    return _first_problem(jobs, check, name_the_job=True)


def _first_problem(jobs: Jobs, judge: Callable[[DictConfig], object], name_the_job: bool) -> str | None:
    for job, cfg in jobs:
        try:
            with contextlib.redirect_stderr(io.StringIO()):  # a warning: each job prints its own as it starts
                judge(cfg)
        except ConfigError as e:
            return in_the_job(e, job, [j for j, _ in jobs]) if name_the_job else str(e)
        except Exception:  # anything else: left to the job, which reports it as its failure
            continue
    return None
