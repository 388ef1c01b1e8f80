"""What `train.py` runs under Hydra: one job, with user errors turned into one line and exit code 2."""

import logging
import shutil
import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from torch.multiprocessing import ProcessExitedException, ProcessRaisedException

from psgd.config import ConfigError
from psgd.data import DataError
from psgd.run import train


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "unknown error"


def _discard_empty_run_dir(run_dir: Path) -> None:
    """A run that failed before training leaves no results: drop the dir Hydra made for it."""
    if not run_dir.is_dir() or (run_dir / "metrics.json").exists():
        return
    if all(p.name == ".hydra" or p.suffix == ".log" for p in run_dir.iterdir()):
        shutil.rmtree(run_dir, ignore_errors=True)


def fail(message: str) -> None:
    print(f"psgd: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def run_job(cfg: DictConfig) -> float | None:
    """Train one job in Hydra's output dir; returns the test accuracy (Hydra sweepers can optimise it)."""
    # torch logs a line per surviving worker it terminates after another one died; the error says it all
    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        metrics = train(cfg, run_dir)
    except (ConfigError, DataError) as e:
        _discard_empty_run_dir(run_dir)
        fail(str(e))
    except ProcessRaisedException as e:
        fail(f"worker rank {e.error_index} failed: {_last_line(e)}")
    except ProcessExitedException as e:
        how = f"signal {e.signal_name}" if e.signal_name else f"exit code {e.exit_code}"
        fail(f"worker rank {e.error_index} died ({how}); results of finished epochs are in {run_dir}")
    print(
        f"psgd: test_acc={metrics['test_acc']:.4f} train_time_s={metrics['train_time_s']:.1f} "
        f"samples_per_s={metrics['samples_per_s']} results in {run_dir}",
        flush=True,
    )
    return metrics["test_acc"]
