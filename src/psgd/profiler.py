"""Lightning's PyTorch profiler made ready for worker processes."""

from typing import Any

from pytorch_lightning.profilers import PyTorchProfiler


class PyTorchProfilerForWorkers(PyTorchProfiler):
    """Lightning's PyTorchProfiler (`+trainer.profiler=pytorch`), which worker processes can receive.

    Lightning's holds torch's default profiling schedule, a local function that pickle refuses, so every
    run whose workers psgd starts (workers > 1, model averaging, HogWild) failed as they started. This
    one is pickled as its settings and made anew in each worker (it has recorded nothing by then).
    """

    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        self._settings = settings

    def __reduce__(self) -> tuple:
        return (_profiler_from_settings, (type(self), self._settings))


def _profiler_from_settings(cls: type, settings: dict[str, Any]) -> PyTorchProfiler:
    return cls(**settings)
