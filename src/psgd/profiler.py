"""The profiler psgd's Trainer gets when the user configures none."""

from contextlib import AbstractContextManager, nullcontext

from pytorch_lightning.profilers import PassThroughProfiler
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
