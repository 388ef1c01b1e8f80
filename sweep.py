"""Sweep training jobs: `python sweep.py -m workers=1,2,3,4,5` (one job per value, under multirun/).

Each job is a full `train.py` run in its own output dir under the sweep dir. The sweep report
(speedup/efficiency tables and plots) belongs to the sweeps issue and is not built yet.
"""

import hydra
from omegaconf import DictConfig

from psgd.cli import run_job


@hydra.main(version_base="1.3", config_path="conf", config_name="sweep")
def main(cfg: DictConfig) -> float | None:
    return run_job(cfg)


if __name__ == "__main__":
    main()
