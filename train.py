"""Train one network: `python train.py [group=choice ...] [key=value ...]` (see conf/train.yaml)."""

import atexit
import gc
from pathlib import Path

import hydra
from omegaconf import DictConfig

from psgd.command_line import check_command_line  # light: torch and Lightning load once the line is checked

CONF = Path(__file__).resolve().parent / "conf"


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    from psgd.cli import run_job

    return run_job(cfg)


if __name__ == "__main__":
    # the last exit handler: spare the exit its full-heap collections (~1.3 s with torch and Lightning loaded)
    atexit.register(gc.freeze)
    check_command_line("train", CONF)
    main()
