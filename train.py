"""Train one network: `python train.py [group=choice ...] [key=value ...]` (see conf/train.yaml)."""

import hydra
from omegaconf import DictConfig

from psgd.cli import run_job


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    return run_job(cfg)


if __name__ == "__main__":
    main()
