"""Sweep training jobs: `python sweep.py -m workers=1,2,3,4,5 [strategy=ddp,hogwild ...]` (the -m,
Hydra's multirun flag, is implied: sweep.py always runs a multirun).

Each job is a full `train.py` run in its own dir under the sweep dir (multirun/<date>/<time>/<n>/),
started in a fresh process tree. A line is printed per finished job; when the multirun ends the sweep
dir gets report.csv, summary.csv, report.md and PNG plots (psgd.report; rebuild them with
`python -m psgd.report <sweep dir>`). A failed job is marked failed in the report and the others go
on; the exit code is then 1. A mistyped choice or key, or a value psgd refuses, in any job is one
line and exit code 2 before any job runs. A sweep stopped early (Ctrl-C, SIGTERM) writes the report
of the jobs that ran.
"""

import atexit
import gc
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from psgd.command_line import (  # light: torch and Lightning load after the check
    check_command_line,
    exit_interrupted,
    exit_pipe_closed,
    load_training,
    sweep_argv,
)
from psgd.forkserver import start_early  # light too: starts the workers' fork server, where they need one
from psgd.signals import interrupt_on_sigterm  # light too: the standard library only

CONF = Path(__file__).resolve().parent / "conf"


@hydra.main(version_base="1.3", config_path="conf", config_name="sweep")
def main(cfg: DictConfig) -> float | None:
    from psgd.cli import run_job

    return run_job(cfg)


def jobs_problem(jobs) -> str | None:
    """psgd's checks of every job's values: first those that need no torch (a bad value is reported
    in about a second), then, with torch loaded, those that depend on this machine, and its datasets."""
    from psgd.config import sweep_data_problem, sweep_values_problem, values_problem

    problem = values_problem(jobs, name_the_job=True)
    if problem:
        return problem
    start_early(jobs)  # the fork server of the jobs' workers, if any needs one: it imports while this process does
    # torch loads for the second: with Ctrl-C and SIGTERM held, as load_training always does (a Ctrl-C
    # inside numpy's import left it half-loaded: "ImportError: cannot load module more than once")
    load_training()
    return sweep_values_problem(jobs) or sweep_data_problem(jobs)


if __name__ == "__main__":
    # the last exit handler: spare the exit its full-heap collections (~1.3 s with torch and Lightning loaded)
    atexit.register(gc.freeze)
    interrupt_on_sigterm()  # as Ctrl-C, also while torch loads
    sys.argv[1:] = sweep_argv(sys.argv[1:])
    try:
        check_command_line("sweep", CONF, job_check=jobs_problem)
        load_training()
        main()
    except BaseException as e:  # Ctrl-C, SIGTERM: the jobs that ran still get their report
        sweep = sys.modules.get("psgd.sweep")  # not loaded: no sweep started
        said = sweep is not None and sweep.report_stopped_sweep()
        if isinstance(e, KeyboardInterrupt):
            exit_interrupted(said)
        if isinstance(e, BrokenPipeError):
            exit_pipe_closed()
        raise
    from psgd.sweep import LAST

    sys.exit(1 if LAST["failed"] else 0)
