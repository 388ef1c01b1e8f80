"""What train.py and sweep.py run as Hydra's job: one training run, and its failure as one line."""

import contextlib
import logging
import re
import shutil
import signal
import sys
import traceback
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig
from torch.multiprocessing import ProcessExitedException, ProcessRaisedException

from psgd import outputs, signals, torchrun
from psgd.config import ConfigError, DirInUse
from psgd.console import fail, first_worker, global_rank, other_torchrun_worker, text_lines
from psgd.errors import DataError, KilledWorker, TrainingDiverged, WorkerGone
from psgd.io import NO_ROOM, say, write_atomic
from psgd.report import averaging_note, skew_note, stop_note
from psgd.run import train
from psgd.stopped import mark_status, raised_in_worker

# errors whose message is the whole story: one line, no traceback, also when a worker raised them
KNOWN_ERRORS = (ConfigError, DataError, TrainingDiverged, WorkerGone)
BAD_INPUT = (ConfigError, DataError)  # nothing trained: the run leaves no dir
# how long the torchrun worker that takes a refused run's dir away waits for the others on its machine to be
# past Hydra's set-up of it (on a loaded machine their imports can differ by seconds)
WORKERS_SET_UP_WITHIN_S = 20.0


def run_job(cfg: DictConfig) -> float | None:
    """Train one job in Hydra's output dir; its test accuracy (for Hydra's sweepers), or None for a sweep's
    failed job. A single run's failure ends the process (run_failed)."""
    # torch logs a line per surviving worker it terminates after another one died; the error says it all
    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    sweeping = hydra_cfg.mode == RunMode.MULTIRUN
    torchrun.mark_running_under_torchrun()  # Hydra's set-up of the run dir is done (wait_for_this_machines_workers)
    try:
        signals.release_held()  # Ctrl-C or SIGTERM while Hydra made the run dir: handled here
        metrics = train(cfg, run_dir)
    except KeyboardInterrupt:  # before training (from fit on, psgd.run winds the run down): nothing to keep
        discard_empty_run_dir(run_dir)
        raise
    except Exception as e:
        if not sweeping:
            run_failed(e, run_dir)
        line = error_line(e, run_dir)  # a sweep's job: marked failed, said, and the sweep goes on
        if not isinstance(e, DirInUse):  # the earlier job's record stays as it was
            keep_failure(e, run_dir, line)
        say(f"psgd: error: {line}")
        return None
    if metrics is None:  # a torchrun / srun worker other than rank 0: rank 0 reports
        return None
    if not sweeping:  # a sweep prints one progress line per job instead (psgd.sweep)
        say_result(metrics, run_dir)
    return metrics["test_acc"]


def run_failed(e: Exception, run_dir: Path) -> None:
    """End a single run that raised `e`: one line and exit code 2. Bad input leaves no run dir; any other
    failure marks the run's record failed, and a bug's traceback goes to the file its line names.

    Under torchrun every worker of a machine finds the same bad input in one dir: the first takes the dir
    away once all are past Hydra's set-up of it (Hydra's log handler fails in a dir taken away), the others
    only after the first has said the line and exited.
    """
    discard = isinstance(e, BAD_INPUT) or raised_in_worker(e, BAD_INPUT) is not None
    every_worker_finds_it = getattr(e, "every_worker_finds_it", False)
    after_the_first = discard and every_worker_finds_it and other_torchrun_worker()
    if discard and not after_the_first:
        torchrun.wait_for_this_machines_workers(WORKERS_SET_UP_WITHIN_S)
        discard_empty_run_dir(run_dir)
    line = error_line(e, run_dir)
    if not discard:  # one process marks the record
        keep_failure(e, run_dir, line, mark=first_worker() or (isinstance(e, WorkerGone) and e.records))
    if isinstance(e, WorkerGone) and not e.says_so:  # another worker on this machine says it
        raise SystemExit(2) from None
    try:
        fail(line, every_worker_finds_it=every_worker_finds_it)
    finally:
        if after_the_first:  # the first has said it and exited (or did not in time, and this one has)
            discard_empty_run_dir(run_dir)


def discard_empty_run_dir(run_dir: Path) -> None:
    """Drop the dir of a run that failed before training if it holds only what Hydra and TensorBoard write at
    the start, and the folders above it that the run made (below outputs.existed)."""

    def empty(p: Path) -> bool:
        if p.name == "tensorboard" and p.is_dir():
            return all(f.name.startswith("events.out.tfevents.") or f.name == "hparams.yaml" for f in p.iterdir())
        return p.name == ".hydra" or p.suffix == ".log"

    with signals.held(signal.SIGINT, signal.SIGTERM):
        if not run_dir.is_dir() or not all(empty(p) for p in run_dir.iterdir()):
            return
        shutil.rmtree(run_dir, ignore_errors=True)
        for folder in run_dir.absolute().parents:
            if outputs.existed is None or outputs.existed not in folder.parents:
                break
            try:
                folder.rmdir()
            except OSError:  # not empty: another run's
                break


def unwritable(e: BaseException) -> str | None:
    """`cannot write <file>: <reason>` for a write that found no room (ENOSPC, a quota) here or in a worker."""
    if isinstance(e, OSError) and e.errno in NO_ROOM:
        return f"cannot write {e.filename}: {e.strerror}"
    found = isinstance(e, ProcessRaisedException) and re.search(r"\[Errno (\d+)\] (.*): '(.*)'$", text_lines(e)[-1])
    return f"cannot write {found[3]}: {found[2]}" if found and int(found[1]) in NO_ROOM else None


def error_line(e: BaseException, run_dir: Path) -> str:
    """The one line a user sees for a job that did not finish: psgd's own error's message; the file a full
    disk could not take; a dead worker named by its rank; else the error's line, its rank and where its traceback is."""
    if isinstance(e, KNOWN_ERRORS):
        return str(e)
    if isinstance(e, KilledWorker):  # unresponsive or out of memory: the message says why
        return f"{e}; results of finished epochs are in {run_dir}"
    if why := unwritable(e):
        return why
    if isinstance(e, ProcessExitedException):
        how = f"signal {e.signal_name}" if e.signal_name else f"exit code {e.exit_code}"
        return f"worker rank {e.error_index} died ({how}); results of finished epochs are in {run_dir}"
    if isinstance(e, ProcessRaisedException):
        known = raised_in_worker(e, KNOWN_ERRORS)
        line = f"worker rank {e.error_index} failed: {message_line(e)}"
    else:
        known = None
        rank = global_rank()  # under torchrun / srun each worker is a train.py process and says its rank
        line = f"{f'worker rank {rank} failed: ' if rank is not None else ''}{type(e).__name__}: {message_line(e)}"
    return known or f"{line} (traceback in {traceback_path(run_dir)})"


def message_line(e: BaseException) -> str:
    """The last line of an error's message (or a worker's traceback), above OmegaConf's context lines."""
    lines = text_lines(e)
    while len(lines) > 1 and re.match(r"(full_key: |object_type=|reference_type=)", lines[-1]):
        lines.pop()
    return lines[-1]


def traceback_path(run_dir: Path) -> Path:
    """Where a failed job keeps its traceback: error.log, or error.rank<r>.log for a torchrun / srun rank r > 0."""
    rank = global_rank()
    return run_dir / ("error.log" if rank in (None, "0") else f"error.rank{rank}.log")


def keeps_traceback(e: BaseException) -> bool:
    """An error whose line names a traceback file: not psgd's own, a full disk's or a worker's death."""
    known = isinstance(e, (*KNOWN_ERRORS, KilledWorker, ProcessExitedException)) or raised_in_worker(e, KNOWN_ERRORS)
    return not (known or unwritable(e))


def keep_failure(e: BaseException, run_dir: Path, line: str, mark: bool = True) -> None:
    """Mark the run's record failed with `line` (if `mark`; not where the disk is full: `e` is the error to
    report) and keep a bug's whole traceback (a worker's is in its text) in traceback_path, or else on stderr."""
    if mark:
        with contextlib.suppress(OSError):
            mark_status(run_dir / "metrics.json", "failed", create=True, error=line)
    if keeps_traceback(e):
        text = "".join(traceback.format_exception(e))
        try:
            write_atomic(traceback_path(run_dir), text)
        except OSError:
            print(text.rstrip(), file=sys.stderr, flush=True)


def say_result(metrics: dict, run_dir: Path) -> None:
    """A finished run's line: test accuracy, time, throughput, its dir."""
    print(
        f"psgd: test_acc={metrics['test_acc']:.4f}{averaging_note(metrics)}{skew_note(metrics)} "
        f"train_time_s={metrics['train_time_s']:.1f} samples_per_s={metrics['samples_per_s']}"
        f"{stop_note(metrics)} results in {run_dir}",
        flush=True,
    )
