"""Lightning's PyTorch profiler made ready for worker processes."""

from functools import partial
from typing import Any

from pytorch_lightning.profilers import PyTorchProfiler


class PyTorchProfilerForWorkers(PyTorchProfiler):
    """Lightning's PyTorchProfiler (`+trainer.profiler=pytorch`), pickled as its settings and made anew in
    each worker process: Lightning's holds torch's default schedule, a local function pickle refuses."""

    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        self._settings = settings

    def __reduce__(self) -> tuple:
        return partial(type(self), **self._settings), ()
