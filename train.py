"""Train one network: `python train.py [group=choice ...] [key=value ...]` (see conf/train.yaml).

`python train.py -m key=a,b ...` runs a sweep, as sweep.py does."""

from pathlib import Path

import hydra
from omegaconf import DictConfig

from psgd import command_line  # light: torch loads once the command line is checked


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    from psgd.cli import run_job  # loaded by command_line.main, after its check

    return run_job(cfg)


if __name__ == "__main__":
    command_line.main(main, "train", Path(__file__).resolve().parent / "conf")
