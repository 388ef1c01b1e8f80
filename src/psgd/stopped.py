"""A run that stopped early, marked in metrics.json (its finished epochs kept) and reported: interrupted
(Ctrl-C, SIGTERM), failed, or a worker gone under torchrun."""

import time
from contextlib import suppress
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from pytorch_lightning.utilities.exceptions import MisconfigurationException
from torch.multiprocessing import ProcessRaisedException

from psgd import signals, torchrun
from psgd.console import text_lines
from psgd.errors import WorkerGone
from psgd.io import read_json, remove_temp_files, say, write_json
from psgd.process import oom_kills_since
from psgd.strategies.workers import lost_a_peer


def mark_status(record_path: Path, status: str, create: bool = False, **fields: Any) -> dict[str, Any] | None:
    """Set `status` (and `fields`) in a run's metrics.json; `create`: also where there is none yet. Returns the
    record as written, or None."""
    if not (record_path.exists() or create):
        return None
    record = read_json(record_path) if record_path.exists() else {}
    record.update(status=status, **fields)
    write_json(record_path, record)
    return record


def raised_in_worker(e: BaseException, classes: tuple[type, ...]) -> str | None:
    """The message of an error of one of `classes` that a worker raised (in `e`'s last traceback line), or None."""
    if not isinstance(e, ProcessRaisedException):
        return None
    last = text_lines(e)[-1]
    for c in classes:
        prefix = f"{c.__module__}.{c.__qualname__}: "
        if last.startswith(prefix):
            return last[len(prefix) :]
    return None


def lightning_refusal(e: BaseException) -> str | None:
    """The message of a setting Lightning refuses only inside fit, once it has the data, here or in a worker:
    a MisconfigurationException, or the ValueError of a val_check_interval longer than an epoch."""
    if isinstance(e, ProcessRaisedException):
        message = text_lines(e)[-1].removeprefix("ValueError:").strip()
        return message if message.startswith(_VAL_CHECK) else raised_in_worker(e, (MisconfigurationException,))
    said = " ".join(text_lines(e))
    if isinstance(e, MisconfigurationException) or (isinstance(e, ValueError) and said.startswith(_VAL_CHECK)):
        return said
    return None


_VAL_CHECK = "`val_check_interval` ("  # Lightning's fit loop, once it knows the epoch's batches


def torchrun_worker_gone(e: BaseException, run_dir: Path) -> WorkerGone | None:
    """The WorkerGone that stopped a torchrun worker's fit with `e` (the agent's SIGTERM, or a collective
    that lost its peer: a peer's sockets close a moment before its process is seen gone, so that case
    looks again for up to a second); None where no worker here died without a word."""
    signalled = isinstance(e, KeyboardInterrupt | SystemExit) and signals.received == "SIGTERM"
    lost = isinstance(e, RuntimeError) and lost_a_peer(text_lines(e)[-1])
    if not (signalled or lost):
        return None
    deadline = time.monotonic() + (1.0 if lost else 0.0)
    gone, survivors = torchrun.torchrun_workers_gone()
    while not gone and time.monotonic() < deadline:
        time.sleep(0.05)
        gone, survivors = torchrun.torchrun_workers_gone()
    if not gone:
        return None
    return WorkerGone(gone, survivors, run_dir, oom_kills_since(torchrun.oom_kills_at_mark))


def mark_stopped(run_dir: Path, e: BaseException, launched: bool = False, info: dict[str, Any] | None = None) -> None:
    """Mark a run that `e` stopped: interrupted (Ctrl-C, SIGTERM: one line says so) or failed, its finished
    epochs kept. `launched`: psgd's launcher started the run's workers, this process's children. `info`: what
    metrics.json says of the run (run_info's), for the record of an interrupt where none was written yet (its
    workers were starting)."""
    interrupted = isinstance(e, KeyboardInterrupt | SystemExit)  # Lightning turns Ctrl-C into exit(1)
    if interrupted:
        # the workers got the signal too (psgd.signals): let them end before this write, none left behind
        signals.wind_down_children()
        if launched:  # such a worker dies at once by the signal, maybe leaving a write's temp file
            remove_temp_files(run_dir)
    # every worker has stopped by now, so nothing races this write
    record = None
    with suppress(OSError):  # best effort: on a full disk the mark cannot be written, and `e` is what to report
        status, path = "interrupted" if interrupted else "failed", run_dir / "metrics.json"
        record = mark_status(path, status)
        if record is None and info is not None and interrupted:  # (a failure says so in cli's own record)
            record = mark_status(path, status, create=True, **info, epochs=0, history=[])
    if interrupted:
        how = f" ({signals.received})" if signals.received else ""
        finished = (record or {}).get("epochs", 0)
        kept = f"finished epochs are kept in {run_dir}" if finished else f"no epoch had finished ({run_dir})"
        say(f"psgd: interrupted{how}; {kept}")


def exit_if_interrupted(e: BaseException) -> None:
    """After mark_stopped: a run that Ctrl-C or SIGTERM stopped exits 130 or 143, as a shell reports the
    signal; called from Python (no Hydra job), it raises KeyboardInterrupt instead."""
    if isinstance(e, KeyboardInterrupt | SystemExit):
        if not HydraConfig.initialized():
            raise KeyboardInterrupt(*([signals.received] if signals.received else [])) from None
        raise SystemExit(signals.interrupted_exit_code()) from None
