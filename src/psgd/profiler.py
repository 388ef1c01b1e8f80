"""The profiler psgd's Trainer gets when the user configures none, and Lightning's PyTorch profiler made
ready for worker processes."""

from contextlib import AbstractContextManager, nullcontext
from typing import Any

from pytorch_lightning.profilers import PassThroughProfiler, PyTorchProfiler
from typing_extensions import override

_NOTHING = nullcontext()


class NoProfiler(PassThroughProfiler):
    """Profiles nothing, at no cost per hook call.

    Lightning wraps every hook call (~40 per training step, more with each callback) in
    `trainer.profiler.profile(name)`. Its default PassThroughProfiler does nothing too, but through a
    generator-based context manager built anew for every call: ~35 us per step
    (benchmarks/step_overhead.py). This one hands back one shared no-op context manager. Any profiler
    the user asks for (`+trainer.profiler=simple`) is used instead.
    """

    @override
    def profile(self, action_name: str) -> AbstractContextManager:
        return _NOTHING


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
