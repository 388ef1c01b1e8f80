"""Data-parallel SGD: Lightning's DDPStrategy (gradients all-reduced every step), with psgd's failure
reports (FirstFailureLaunch), the gradient exchange counted and timed, and gradient compression.

psgd registers its own DDP communication hook on every device (DDP's public `register_comm_hook`): the
`strategy.compression` method's (psgd.strategies.compression; `none` is torch's own `allreduce_hook`, DDP's
averaging). It counts the bytes each worker hands to torch.distributed, and on CPU clocks each bucket's launch
and completion. A step's figures, an epoch's being the medians of its steps:

- all-reduce: from the first gradient bucket's launch to the last one's completion;
- wait: from the last bucket's launch (the backward's compute has ended) to its completion, when the step
  stood still for the other workers' gradients.

On a GPU the hook's clock would read when the host queued the work: nothing is timed there. A compression's
state (error buffers, PowerSGD's memory and random stream) is each worker's own and goes into checkpoints.
"""

import math
import statistics
import time
from typing import Any, ClassVar

import pytorch_lightning as L
import torch
import torch.distributed as dist
from pytorch_lightning.strategies import DDPStrategy
from pytorch_lightning.utilities import move_data_to_device
from torch.futures import Future
from torch.nn.parallel import DistributedDataParallel
from typing_extensions import override

from psgd.strategies.compression import STATEFUL, Compressor, PowerSGD, build_compressor
from psgd.strategies.lightning_internals import FirstFailureLaunch, without_per_step_collectives
from psgd.strategies.records import Reports
from psgd.strategies.workers import GroupEndsAtExit, over_workers

COMPRESSION_KEY = "psgd_compression"  # a checkpoint's compression state of every worker


class TimesAllReduce:
    """Mixin for a DDPStrategy: the gradient exchange through psgd's comm hook, compressed as `compression`
    says (with `compression_options`, build_compressor's keywords), counted (`comm_count`) and on CPU timed
    (`epoch_figures`)."""

    figures: ClassVar[dict[str, tuple[str, int]]] = {
        "allreduce_ms": ("ddp/allreduce_ms", 3),
        "allreduce_wait_ms": ("ddp/allreduce_wait_ms", 3),
    }

    def __init__(
        self, *args: Any, compression: str = "none", compression_options: dict | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.compression, self.compression_options = compression, dict(compression_options or {})
        self.compressor: Compressor | None = None  # once set up
        self._compressor_states: list[dict] | None = None  # the workers' held here, from the checkpoint resumed
        self.allreduce_timed = False  # a DDP wrapper on CPU: every bucket clocked
        self._buckets: list[tuple[float, float]] = []  # this step's buckets: (launched, done), perf_counter s
        self._steps: list[tuple[float, float]] = []  # this epoch's steps: (all-reduce ms, wait ms)
        self._comm_s = 0.0  # this epoch's all-reduce time, summed over its steps
        self.waited_s = 0.0  # the steps' waits for the other workers' gradients since the start, on CPU (s)
        self.report: dict[str, Any] = {}  # nothing more at the end than the epochs said

    def configure_ddp(self) -> None:
        super().configure_ddp()
        if not isinstance(self.model, DistributedDataParallel):
            return
        self._build_compressor()
        self.allreduce_timed = self.root_device.type == "cpu"
        self.model.register_comm_hook(None, self._exchange)

    def setup(self, trainer: L.Trainer) -> None:
        super().setup(trainer)
        if self.compressor is None:  # no DDP wrapper (simulated workers): exchange_gradients uses it
            self._build_compressor()

    def _build_compressor(self) -> None:
        # the default group (self.comm holds none): a compressor holding the ProcessGroup object kept its gloo
        # threads alive past the group's end at exit (GroupEndsAtExit), into a spawned worker's interpreter shutdown
        params = list(self.lightning_module.parameters())
        self.compressor = build_compressor(self.compression, self.comm, params, **self.compression_options)
        if self._compressor_states is not None:
            self.compressor.load_state_dicts(move_data_to_device(self._compressor_states, self.root_device))

    def on_train_start(self) -> None:
        """Say where the run is too short for its compression: PowerSGD all-reduces plainly for its first steps."""
        super().on_train_start()
        if not (isinstance(self.compressor, PowerSGD) and self.is_global_zero):
            return
        start, steps = self.compressor.start_step, self.lightning_module.trainer.estimated_stepping_batches
        if steps < start:
            print(
                f"psgd: strategy.compression=powersgd compresses from step {start} (strategy.powersgd_start_step) and "
                f"this run takes {steps}: it runs as plain DDP",
                flush=True,
            )

    def _exchange(self, state: Any, bucket: dist.GradBucket) -> Future[torch.Tensor]:
        """The compressor's hook, its bucket's launch and completion clocked on CPU (the completion in the future
        DDP waits on, so that a step's buckets are all clocked when its backward returns)."""
        launched = time.perf_counter()
        future = self.compressor.hook(state, bucket)
        if not self.allreduce_timed:
            return future

        def done(fut: Future) -> Any:
            self._buckets.append((launched, time.perf_counter()))
            return fut.value()

        return future.then(done)

    def comm_count(self) -> list[list[float]]:
        """This epoch's [payload bytes, bytes sent, collectives, seconds] of this worker (seconds NaN on a GPU,
        where nothing is timed); they start anew."""
        payload, sent, calls = self.compressor.take_count() if self.compressor is not None else (0, 0, 0)
        seconds, self._comm_s = self._comm_s, 0.0
        seconds = seconds if self.allreduce_timed or not calls else math.nan
        return [[payload, sent, calls, seconds]] * len(self.comm.ranks)

    def exchange_gradients(self, grads: list[torch.Tensor]) -> None:
        """Simulated workers (psgd.strategies.simulated), whose module no DDP wraps: DDP's exchange, compressed as
        in a worker process, of every parameter's gradients at once (each as rows [P, numel], in memory order), in
        the order DDP's bucket holds them: the parameters reversed, as their gradients become ready (PowerSGD draws
        its first Qs in that order)."""
        self.compressor.exchange(list(enumerate(grads))[::-1]).wait()

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None) -> None:
        """With a compression that keeps state: every worker's in the checkpoint, under COMPRESSION_KEY."""
        if self.compressor is not None and self.compression in STATEFUL:
            held = self.comm.gather_objects(move_data_to_device(self.compressor.state_dicts(), "cpu"))
            states = [state for states in held for state in states]  # every worker's, in rank order
            checkpoint = {**checkpoint, COMPRESSION_KEY: {"compression": self.compression, "workers": states}}
        super().save_checkpoint(checkpoint, filepath, storage_options)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        """The checkpoint; the compression state of the workers held here kept for the compressor (the same
        compression and worker count only: else it starts afresh)."""
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        saved = checkpoint.get(COMPRESSION_KEY) or {}
        if saved.get("compression") == self.compression and len(saved.get("workers") or []) == self.comm.size:
            self._compressor_states = [saved["workers"][rank] for rank in self.comm.ranks]
        return checkpoint

    def optimizer_step(self, *args: Any, **kwargs: Any) -> Any:
        out = super().optimizer_step(*args, **kwargs)
        if self._buckets:
            buckets, self._buckets = self._buckets, []
            first, last, end = min(b[0] for b in buckets), max(b[0] for b in buckets), max(b[1] for b in buckets)
            self._steps.append(((end - first) * 1e3, (end - last) * 1e3))
            self._comm_s += end - first
            self.waited_s += end - last
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


class Workers(FirstFailureLaunch, GroupEndsAtExit, Reports, DDPStrategy):
    """Lightning's DDPStrategy as psgd runs workers: started by FirstFailureLauncher (a failed run names the
    worker that failed first), their process group ended at exit, no collective in a step but the strategy's
    own, and what they record told to psgd's callbacks (Reports)."""

    @override
    def setup(self, trainer: L.Trainer) -> None:
        super().setup(trainer)
        without_per_step_collectives(trainer)


class ReportsFirstFailure(TimesAllReduce, Workers):
    """psgd's DDP: Workers whose gradients are exchanged through psgd's comm hook (TimesAllReduce)."""

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
