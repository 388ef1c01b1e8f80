"""The environment stored next to every result: the machine's device and cores, the library versions.

torch and the other libraries load inside the functions that need them: the configuration checks
import `cpu_count` before torch is loaded, so this module must not load it.
"""

import os
import platform
from contextlib import suppress

from psgd import __version__


def cpu_count() -> int:
    """Cores this process may use (affinity-aware)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _cpu_name() -> str:
    with suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def device_description(accelerator: str) -> str:
    """`cuda: <GPU name> x<count>` for a GPU run, else `cpu: <CPU name> (<cores> cores)`."""
    import torch

    if accelerator == "gpu" and torch.cuda.is_available():
        return f"cuda: {torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}"
    return f"cpu: {_cpu_name()} ({cpu_count()} cores)"


def versions() -> dict[str, str]:
    """The versions of Python, psgd and the libraries a run's results depend on."""
    import hydra
    import pytorch_lightning
    import torch
    import torchvision

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "pytorch_lightning": pytorch_lightning.__version__,
        "hydra": hydra.__version__,
        "psgd": __version__,
    }
