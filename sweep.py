"""Sweep training jobs: `python sweep.py [-m] workers=1,2,3,4,5 [strategy=ddp,hogwild ...]` (see conf/sweep.yaml).

Each job is a full train.py run in its own dir under the sweep dir (multirun/<date>/<time>/<n>/), with a
line per finished job; the sweep dir then gets report.csv, summary.csv, report.md and PNG plots
(psgd.report; rebuild them with `python -m psgd.report <sweep dir>`). A failed job is marked failed in the
report and the others go on; the exit code is then 1. A mistyped choice or key, or a value psgd refuses,
in any job is one line and exit code 2 before any job runs. A sweep stopped early (Ctrl-C, SIGTERM) writes
the report of the jobs that ran; `continue_sweep=<its dir>` goes on with the others.
"""

from pathlib import Path

import hydra
from omegaconf import DictConfig

from psgd import command_line  # light: torch loads once the command line is checked


@hydra.main(version_base="1.3", config_path="conf", config_name="sweep")
def main(cfg: DictConfig) -> float | None:
    from psgd.cli import run_job  # loaded by command_line.main, after its check

    return run_job(cfg)


if __name__ == "__main__":
    command_line.main(main, "sweep", Path(__file__).resolve().parent / "conf")
