"""Train one network: `python train.py [group=choice ...] [key=value ...]` (see conf/train.yaml)."""

import atexit
import gc
from pathlib import Path

import hydra
from omegaconf import DictConfig

from psgd.command_line import (  # light: torch loads once the line is checked
    check_command_line,
    exit_interrupted,
    exit_pipe_closed,
    load_training,
)
from psgd.config import values_problem  # light too: psgd's value checks that need no torch
from psgd.signals import interrupt_on_sigterm  # light too: the standard library only

CONF = Path(__file__).resolve().parent / "conf"


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    from psgd.cli import run_job

    return run_job(cfg)


if __name__ == "__main__":
    # the last exit handler: spare the exit its full-heap collections (~1.3 s with torch and Lightning loaded)
    atexit.register(gc.freeze)
    interrupt_on_sigterm()  # as Ctrl-C, also while torch loads
    try:
        check_command_line("train", CONF, job_check=lambda jobs: values_problem(jobs, name_the_job=len(jobs) > 1))
        load_training()
        main()
    except KeyboardInterrupt:
        exit_interrupted()
    except BrokenPipeError:
        exit_pipe_closed()
