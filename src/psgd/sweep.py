"""The Hydra callback behind `sweep.py -m`: a progress line per finished job, the report at the end. It reads
only what the jobs wrote to disk, so it works the same with launchers that run jobs elsewhere (SLURM)."""

import math
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from psgd.report import averaging_note, load_job, report_sweep, skew_note, stop_note, sweep_lengths

# the last multirun of this process: sweep.py's exit code counts its failed jobs, and a multirun that did
# not end (Ctrl-C, SIGTERM) gets the report of the jobs that ran
LAST: dict[str, Any] = {"failed": 0, "sweep_dir": None, "ended": False}


def progress_line(num: int, total: int | None, swept: set[str] | frozenset[str], job_dir: Path) -> str:
    """`psgd: [i/N] key=value ...: completed, 12.3 s training, ..., test_acc 0.9812` (or `failed: <error line>`):
    the job's `swept` values as typed, or all its overrides when nothing is swept."""
    job = load_job(job_dir)  # as the report reads it
    where = f"[{num + 1}/{total}]" if total else f"[{num + 1}]"
    values = " ".join(f"{k}={v}" for k, v in job["overrides"].items() if not swept or k in swept) or "(defaults)"
    if job["status"] == "completed":
        return (
            f"psgd: {where} {values}: completed, {job.get('train_time_s', 0):.1f} s training, "
            f"{job.get('samples_per_s')} samples/s, test_acc {job.get('test_acc'):.4f}"
            f"{averaging_note(job)}{skew_note(job)}{stop_note(job)}"
        )
    return f"psgd: {where} {values}: {job['status']}: {job['error'] or 'no result written'}"


class SweepReport(Callback):
    """The progress lines and the report of a multirun (registered in conf/sweep.yaml under hydra.callbacks)."""

    total: int | None = None  # the sweep's jobs, where they can be counted
    swept: frozenset[str] = frozenset()  # keys with several values: the ones a progress line shows

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        LAST.update(failed=0, sweep_dir=str(config.hydra.sweep.dir), ended=False)
        try:
            lengths = sweep_lengths(config.hydra)
        except Exception:  # a sweep this count cannot read: progress lines go without "/N"
            lengths = {}
        self.total = math.prod(lengths.values()) if lengths else None
        self.swept = frozenset(k for k, n in lengths.items() if n > 1)

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        if config.hydra.mode == RunMode.MULTIRUN:  # (sweep.py with Hydra flags of its own and no -m: no sweep)
            job_dir = Path(config.hydra.runtime.output_dir)
            print(progress_line(config.hydra.job.num, self.total, self.swept, job_dir), flush=True)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        LAST["ended"] = True
        report = report_sweep(Path(config.hydra.sweep.dir))
        LAST["failed"] = 1 if report is None else len(report.failed)


def report_stopped_sweep() -> bool:
    """After a multirun that stopped before its end (Ctrl-C, SIGTERM: Hydra runs no end callback then), report
    the jobs that ran. Returns whether it said something (nothing where no multirun started, or it ended)."""
    if LAST["sweep_dir"] is None or LAST["ended"]:
        return False
    report_sweep(Path(LAST["sweep_dir"]), stopped=True)
    return True
