"""Train one network: `python train.py [group=choice ...] [key=value ...]` (see conf/train.yaml)."""

import atexit
import gc
import os
import signal
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from psgd.command_line import (  # light: torch loads once the line is checked
    check_command_line,
    exit_interrupted,
    exit_pipe_closed,
    hydra_order,
    interpreter_flags,
    is_multirun,
    load_training,
)
from psgd.config import values_problem  # light too: psgd's value checks that need no torch
from psgd.forkserver import start_early  # light too: starts the workers' fork server, where they need one
from psgd.signals import held_until_released, interrupt_on_sigterm  # light too: the standard library only

CONF = Path(__file__).resolve().parent / "conf"


def jobs_problem(jobs) -> str | None:
    """psgd's checks of the job's values that need no torch; with none found, the fork server that will
    start its workers is started now, to import torch and Lightning while this process does."""
    problem = values_problem(jobs, name_the_job=len(jobs) > 1)
    if problem is None:
        start_early(jobs)
    return problem


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    from psgd.cli import run_job

    return run_job(cfg)


if __name__ == "__main__":
    python_flags = interpreter_flags()  # read before the arguments change: it counts them
    sys.argv[1:] = hydra_order(sys.argv[1:])  # Hydra's flags after the overrides, where Hydra reads them
    if is_multirun(sys.argv[1:]):  # `train.py -m ...` is a sweep: sweep.py's line per job, report and exit code
        sweep = str(Path(__file__).resolve().with_name("sweep.py"))
        os.execv(sys.executable, [sys.executable, *python_flags, sweep, *sys.argv[1:]])
    # the last exit handler: spare the exit its full-heap collections (~1.3 s with torch and Lightning loaded)
    atexit.register(gc.freeze)
    interrupt_on_sigterm()  # as Ctrl-C, also while torch loads
    try:
        check_command_line("train", CONF, job_check=jobs_problem)
        load_training()
        with held_until_released(signal.SIGINT, signal.SIGTERM):  # while Hydra makes the run dir: the job releases them
            main()
    except KeyboardInterrupt:
        exit_interrupted()
    except BrokenPipeError:
        exit_pipe_closed()
