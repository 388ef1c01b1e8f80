"""Data-parallel SGD: Lightning's DDPStrategy (gradients all-reduced every step), with psgd's failure
reports (FirstFailureLaunch) and the gradient all-reduce timed.

On CPU the all-reduce runs through torch's own `allreduce_hook`, registered with DDP's public
`register_comm_hook` (the same averaging as DDP's built-in one), and each bucket's launch and completion are
clocked. A step's figures, an epoch's being the medians of its steps:

- all-reduce: from the first gradient bucket's launch to the last one's completion;
- wait: from the last bucket's launch (the backward's compute has ended) to its completion, when the step
  stood still for the other workers' gradients.

On a GPU the hook's clock would read when the host queued the work: nothing is timed there.
"""

import statistics
import time
from typing import Any

import pytorch_lightning as L
import torch
import torch.distributed as dist
from pytorch_lightning.strategies import DDPStrategy
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.futures import Future
from torch.nn.parallel import DistributedDataParallel
from typing_extensions import override

from psgd.strategies.lightning_internals import FirstFailureLaunch, without_per_step_collectives
from psgd.strategies.workers import GroupEndsAtExit, over_workers


class TimesAllReduce:
    """Mixin for a DDPStrategy: times the gradient all-reduce of every step on CPU (`epoch_figures`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.allreduce_timed = False  # a DDP wrapper on CPU, its all-reduce through `_timed_allreduce`
        self._buckets: list[tuple[float, float]] = []  # this step's buckets: (launched, done), perf_counter s
        self._steps: list[tuple[float, float]] = []  # this epoch's steps: (all-reduce ms, wait ms)

    def configure_ddp(self) -> None:
        super().configure_ddp()
        self.allreduce_timed = isinstance(self.model, DistributedDataParallel) and self.root_device.type == "cpu"
        if self.allreduce_timed:
            self.model.register_comm_hook(self.model.process_group, self._timed_allreduce)

    def _timed_allreduce(self, group: dist.ProcessGroup, bucket: dist.GradBucket) -> Future[torch.Tensor]:
        """torch's allreduce_hook, its bucket's launch and completion clocked (the completion in the future
        DDP waits on, so that a step's buckets are all clocked when its backward returns)."""
        launched = time.perf_counter()

        def done(fut: Future) -> Any:
            self._buckets.append((launched, time.perf_counter()))
            return fut.value()

        return allreduce_hook(group, bucket).then(done)

    def optimizer_step(self, *args: Any, **kwargs: Any) -> Any:
        out = super().optimizer_step(*args, **kwargs)
        if self._buckets:
            buckets, self._buckets = self._buckets, []
            first, last, end = min(b[0] for b in buckets), max(b[0] for b in buckets), max(b[1] for b in buckets)
            self._steps.append(((end - first) * 1e3, (end - last) * 1e3))
        return out

    def epoch_figures(self) -> dict[str, float]:
        """This epoch's median all-reduce and wait per step (ms), the mean over the workers that timed a
        step of it; the steps start anew."""
        if not self.allreduce_timed:
            return {}
        steps, self._steps = self._steps, []
        own = [0.0, 0.0, 0.0]
        if steps:
            own = [statistics.median(c for c, _ in steps), statistics.median(w for _, w in steps), 1.0]
        total, wait, counted = over_workers(own, self.root_device)
        if not counted:
            return {}
        return {"allreduce_ms": round(total / counted, 3), "allreduce_wait_ms": round(wait / counted, 3)}


class ReportsFirstFailure(TimesAllReduce, FirstFailureLaunch, GroupEndsAtExit, DDPStrategy):
    """psgd's DDPStrategy: workers started by FirstFailureLauncher, the all-reduce timed, and no
    collective in a step but the gradient all-reduce."""

    @override
    def setup(self, trainer: L.Trainer) -> None:
        super().setup(trainer)
        without_per_step_collectives(trainer)

    @override
    def on_exception(self, exception: BaseException) -> None:
        """DDP's error for parameters no loss used ends with psgd's switch for them (torch's and Lightning's
        wordings name DDP's own argument and a strategy string psgd's config has no place for)."""
        if "Expected to have finished reduction" not in str(exception):
            super().on_exception(exception)
            return
        exception.args = (
            f"{exception.args[0]}\nthe model has parameters that no loss used, and DDP needs a gradient for each: "
            "set strategy.find_unused_parameters=true (DDP then looks for them in every step), or leave them out "
            "of the model",
            *exception.args[1:],
        )
