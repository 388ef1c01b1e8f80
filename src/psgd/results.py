"""Run results on disk: atomic JSON/CSV writes, the environment stored next to every number."""

import csv
import io
import json
import os
import platform
import tempfile
from pathlib import Path
from typing import Any


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Write via a temp file in the same folder and rename: readers see the old file or the new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
