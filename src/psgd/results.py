"""Run results on disk: atomic JSON/CSV writes, the environment stored next to every number."""

import csv
import errno
import io
import json
import math
import os
import platform
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

# a write that failed for want of room on the disk (or in a quota), not for anything in the run
NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT})


def say(line: str) -> None:
    """`line` on stderr in one write, newline included. Python's stderr passes each write straight to
    the file, and print() writes its text and its newline apart: two worker processes saying their
    line at once printed "...`:psgd: error: ...`" on one line, then two newlines."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def failed_write(e: OSError) -> str:
    """An OSError's reason and file as a line shows them: `No space left on device: '<file>'`."""
    return f"{e.strerror}: '{e.filename}'" if e.filename else (e.strerror or str(e))


def _umask() -> int:
    """This process's umask: read from /proc (Linux), else set and set back (which a thread creating a
    file at that moment would see, hence once, at import)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _umask()


@contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "w") -> Iterator[IO]:
    """A file to write `path` through: a temp file in the same folder, renamed over `path` once written
    and synced. Readers, and a resume after a crash or a full disk, find the old file or the new one,
    never part of one; a failed write leaves the old one as it was and no temp file. The file gets the
    permissions a plain open() would give (mkstemp's are owner-only)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError) and e.filename is None:  # a failed write names no file: this one
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise


def remove_temp_files(folder: str | os.PathLike) -> list[Path]:
    """Remove the temp files of atomic_file writes under `folder` that never finished: their writer was
    ended at once (a worker dies by the signal that stops its run) between making the file and renaming
    it. Only once nothing writes there any more. Returns those removed."""
    left = [p for p in Path(folder).glob("**/.*.tmp") if p.is_file()]
    for p in left:
        p.unlink(missing_ok=True)
    return left


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` atomically (atomic_file)."""
    with atomic_file(path) as f:
        f.write(text)


def save_atomic(obj: Any, path: str | os.PathLike) -> None:
    """torch.save `obj` to `path` atomically (atomic_file). Serialised in memory first: torch's writer
    reports a full disk as "unexpected pos 324096 vs 324048", a plain write as the OSError it is."""
    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    with atomic_file(path, "wb") as f:
        f.write(buffer.getbuffer())


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_atomic(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def write_csv(path: str | os.PathLike, header: list[str], rows: list[list[Any]]) -> None:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(header)
    writer.writerows(rows)
    write_atomic(path, buf.getvalue())


def read_json(path: str | os.PathLike) -> dict:
    with open(path) as f:
        return json.load(f)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_count() -> int:
    """Cores this process may use (affinity-aware)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def device_description(accelerator: str) -> str:
    import torch

    if accelerator == "gpu" and torch.cuda.is_available():
        return f"cuda: {torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}"
    return f"cpu: {_cpu_name()} ({cpu_count()} cores)"


def cores_of(device: str | None) -> tuple[str, int] | None:
    """The CPU's name and core count in a device_description, or None for a GPU (or no description)."""
    match = re.fullmatch(r"cpu: (.*) \((\d+) cores\)", device or "")
    return (match[1], int(match[2])) if match else None


def versions() -> dict[str, str]:
    import hydra
    import pytorch_lightning
    import torch
    import torchvision

    import psgd

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "pytorch_lightning": pytorch_lightning.__version__,
        "hydra": hydra.__version__,
        "psgd": psgd.__version__,
    }


def allreduce_summary(history: list[dict[str, Any]]) -> dict[str, float]:
    """A DDP run's gradient all-reduce over its epochs (each epoch's figures from psgd's history):
    `allreduce_ms` and `allreduce_wait_ms` per step, weighted by the epochs' steps, and
    `allreduce_wait_share`, the part of the training time the workers stood waiting for it. Empty
    for a run without them (one worker, model averaging, HogWild)."""
    steps_before, steps, comm, wait, trained_s = 0, 0, 0.0, 0.0, 0.0
    for h in history:
        taken, steps_before = h["step"] - steps_before, h["step"]
        if h.get("allreduce_wait_ms") is None or taken <= 0:
            continue
        steps += taken
        comm += h["allreduce_ms"] * taken
        wait += h["allreduce_wait_ms"] * taken
        trained_s += h["epoch_s"]
    if not steps:
        return {}
    return {
        "allreduce_ms": round(comm / steps, 3),
        "allreduce_wait_ms": round(wait / steps, 3),
        "allreduce_wait_share": round(min(1.0, wait / 1000 / trained_s), 4) if trained_s > 0 else None,
    }


def time_share(history: list[dict[str, Any]], key: str) -> float | None:
    """The share of the training time the workers spent as an epoch's `key` says (seconds per epoch,
    the mean over the workers: periodic averaging's `averaging_s`, locked HogWild's `lock_wait_s`),
    over the epochs that have it; None where none has."""
    spent = [(h[key], h["epoch_s"]) for h in history if h.get(key) is not None]
    trained_s = sum(t for _, t in spent)
    if not spent or trained_s <= 0:
        return None
    return round(min(1.0, sum(a for a, _ in spent) / trained_s), 4)


def sync_summary(history: list[dict[str, Any]]) -> dict[str, float]:
    """What synchronising the workers cost a run, from its history: DDP's all-reduce (allreduce_summary),
    `averaging_share` (model averaging with strategy.period: the time in averaging, the all-reduce of the
    weights and the wait there for the other workers) and `lock_wait_share` (HogWild with strategy.lock:
    the time waiting for the update lock). Only the figures the run has."""
    shares = {
        "averaging_share": time_share(history, "averaging_s"),
        "lock_wait_share": time_share(history, "lock_wait_s"),
    }
    return {**allreduce_summary(history), **{k: v for k, v in shares.items() if v is not None}}


def hogwild_workers(strategy: str | None, workers: int | None) -> int | None:
    """The workers of a HogWild run where several write into the one shared model (step_advice), else None."""
    return workers if strategy == "hogwild" and workers is not None and workers > 1 else None


def scales_by_workers(settings: Any) -> bool:
    """Whether lr_scaling multiplied optimizer.lr by the worker count (lr_reference_batch=null; psgd.optim):
    `settings`, a run's config or its metrics.json record, which keeps both keys."""
    return settings.get("lr_scaling") not in (None, "none") and settings.get("lr_reference_batch") is None


def step_advice(
    lr: float | None = None,
    hogwild_workers: int | str | None = None,
    optimizer_lr: float | None = None,
    by_workers: bool = False,
) -> str:
    """What to change when a run's steps were too large (it diverged, or learned nothing): the lr (the
    run's, where known), or a warm-up. Under HogWild (`hogwild_workers`: the count, or "P" for several
    runs) every worker's update lands on the one shared model, so P workers take about P times one
    worker's step: the defaults that train one worker (lr 0.02, momentum 0.9) diverged at 5, and the lr
    to name is one worker's P-th. `optimizer_lr`: the optimizer.lr that lr_scaling turned into the run's
    `lr`, `by_workers` where it scaled by the workers (lr_reference_batch=null). One worker runs
    optimizer.lr itself there, so the lr to set is optimizer.lr / P with lr_scaling=none: the run's lr / P,
    set as optimizer.lr, was scaled straight back to the lr that diverged. Scaled by the batch, one worker
    runs the run's lr too, and optimizer.lr / P is scaled to its P-th."""
    scaled = bool(lr and optimizer_lr and not math.isclose(lr, optimizer_lr, rel_tol=1e-6))
    base = optimizer_lr if scaled else lr
    said = f"the run's lr is {lr:g}" if lr else ""
    if scaled:
        said += f": lr_scaling's {lr / base:.3g} x optimizer.lr {base:g}"
    if hogwild_workers is None:
        return f"lower optimizer.lr{f' ({said})' if said else ''} or warm up (scheduler=warmup)"
    p = hogwild_workers
    if lr and isinstance(p, int):
        to = f"optimizer.lr={float(f'{base / p:.3g}'):g}"
        if scaled and by_workers:  # one worker's lr is optimizer.lr; its P-th, unscaled
            said += f", by the workers; so lr_scaling=none {to}"
        else:
            said += f"{'; so ' if scaled else ': '}{to}"
    elif by_workers:  # several runs, lr_scaling by their workers: the way back to one worker's lr
        said = "with lr_scaling=none: it scaled the lr up by the workers"
    return (
        f"under HogWild the {p} workers' updates all land on the one shared model, about {p} times one worker's "
        f"steps: lower optimizer.lr about {p}-fold{f' ({said})' if said else ''} or optimizer.momentum "
        "(mnist_hogwild's lr 0.01 and momentum 0.5 are experiment=hogwild_lab's)"
    )
