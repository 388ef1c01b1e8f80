"""Data-parallel SGD: Lightning's DDPStrategy (gradients all-reduced every step), with psgd's failure
reports (FirstFailureLaunch) and the gradient all-reduce timed.

The timings are the clock readings torch's DDP reducer records itself (`_get_ddp_logging_data`), sampled
after each of the first 11 steps and then every `allreduce_sample_rate`-th; an epoch's figures are the
medians of its samples:

- all-reduce: from the first gradient bucket's all-reduce launch to the last one's completion;
- wait: the part of it after the backward's compute had ended, when the step stood still for the other
  workers' gradients.
"""

import statistics
from typing import Any

import pytorch_lightning as L
from pytorch_lightning.strategies import DDPStrategy
from torch.nn.parallel import DistributedDataParallel
from typing_extensions import override

from psgd.strategies.lightning_internals import FirstFailureLaunch, without_per_step_collectives
from psgd.strategies.workers import GroupEndsAtExit, over_workers

NS_PER_MS = 1e6


class TimesAllReduce:
    """Mixin for a DDPStrategy: samples the reducer's timings during training (`epoch_figures`)."""

    allreduce_sample_rate = 20  # the reducer's sampling interval, in steps (torch's own default is 100)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._allreduce_steps = 0
        self._allreduce_seen = 0  # the reducer's iteration of the last sample taken
        self._allreduce_samples: list[tuple[float, float]] = []  # (all-reduce ms, wait ms) this epoch
        self.allreduce_timed = False  # a DDP wrapper whose reducer times

    def configure_ddp(self) -> None:
        super().configure_ddp()
        # CPU only: on a GPU the reducer's clock readings are when the host queued the work
        self.allreduce_timed = isinstance(self.model, DistributedDataParallel) and self.root_device.type == "cpu"
        if self.allreduce_timed:
            self.model._set_ddp_runtime_logging_sample_rate(self.allreduce_sample_rate)

    def optimizer_step(self, *args: Any, **kwargs: Any) -> Any:
        out = super().optimizer_step(*args, **kwargs)
        self._allreduce_steps += 1
        if self.allreduce_timed and (
            self._allreduce_steps <= 11 or self._allreduce_steps % self.allreduce_sample_rate == 1
        ):
            self._take_allreduce_sample()
        return out

    def _take_allreduce_sample(self) -> None:
        data = self.model._get_ddp_logging_data()
        iteration = data.get("iteration", 0)
        # the step's clock readings in ns (the reducer's own durations may hold an older step's value)
        forward, computed, start, end = (
            data.get(f"{key}_time_{edge}", -1)
            for key, edge in (
                ("forward_compute", "start"),
                ("backward_compute", "end"),
                ("backward_comm", "start"),
                ("backward_comm", "end"),
            )
        )
        if not iteration or iteration == self._allreduce_seen or not 0 < forward <= start <= end or computed < forward:
            return
        self._allreduce_seen = iteration
        self._allreduce_samples.append(((end - start) / NS_PER_MS, (end - max(start, computed)) / NS_PER_MS))

    def epoch_figures(self) -> dict[str, float]:
        """This epoch's median all-reduce and wait per step (ms), the mean over the workers that have
        samples of it; the samples start anew."""
        if not self.allreduce_timed:
            return {}
        samples, self._allreduce_samples = self._allreduce_samples, []
        own = [0.0, 0.0, 0.0]
        if samples:
            own = [statistics.median(c for c, _ in samples), statistics.median(w for _, w in samples), 1.0]
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
