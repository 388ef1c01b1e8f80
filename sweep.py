"""Sweep training jobs: `python sweep.py [-m] workers=1,2,3,4,5 [strategy=ddp,hogwild ...]` (see conf/sweep.yaml).

Each job is a train.py run in its own dir (multirun/<date>/<time>/<n>/); the sweep dir then gets report.md,
report.csv, summary.csv and plots (psgd.report). A failed job is marked failed, the others go on, and the
exit code is 1."""

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
