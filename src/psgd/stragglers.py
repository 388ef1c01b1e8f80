"""Simulated stragglers: slow and jittery workers on one machine, so that what heterogeneity does to synchronous
and asynchronous SGD shows where every worker really runs at the same speed.

After each training step a worker sleeps

    (f - 1) x c + d

where f is its `slowdown` factor, c the step's measured compute time and d the extra delay `distribution` draws.
c is the time since the worker's previous step ended (its sleep excluded; from the epoch's first batch, that
batch's start): the data, forward, backward and update and the training loop's own work, as a machine f times
slower would take f times as long for all of it; less what the strategy spent in it waiting for the other workers
(its `waited_s`), so that a fast worker's wait for a slow one is not scaled. d:
none (0), fixed (`delay_s`) or exponential (`shift_s` + Exp(mean `delay_s`)), from a stream seeded by (seed,
rank, epoch), so that a rerun, and a run resumed at an epoch, sleeps the same. A sleep frees the worker's core:
it models a slower machine, not a busier one. The other workers meet the sleep where the strategy makes them
wait for this one: DDP's all-reduce every step, model averaging at its averaging points, HogWild not at all.
"""

import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytorch_lightning as L
import torch
from pytorch_lightning.callbacks import Callback
from typing_extensions import override

from psgd.strategies.records import Reports

DRAWS = 1_000_037  # keeps the delays' stream apart from the run's other seeded streams


def simulated(settings: Mapping[str, Any]) -> bool:
    """Whether `stragglers.*` asks for a simulation: a slowdown (all ones too: a baseline that records its workers'
    zero sleep beside the others) or a delay distribution. Off, psgd adds nothing to a step."""
    return settings["slowdown"] is not None or settings["distribution"] != "none"


def describe(settings: Mapping[str, Any]) -> str:
    """What the simulation does, for the console: `worker 3 3x slower`, `every worker sleeps 0.01 s after each
    step`."""
    parts = [f"worker {r} {f:g}x slower" for r, f in enumerate(settings["slowdown"] or []) if f != 1]
    distribution, delay, shift = settings["distribution"], settings["delay_s"], settings["shift_s"]
    if distribution == "fixed":
        parts.append(f"every worker sleeps {delay:g} s after each step")
    elif distribution == "exponential":
        parts.append(f"every worker sleeps {shift:g} s + Exp(mean {delay:g} s) after each step")
    return ", ".join(parts) or "every worker at its own speed"


class Stragglers(Callback):
    """Each worker's simulated slowness (module docstring); `take_wait` hands the epoch's sleep to the recorder.

    Args:
        slowdown: one factor >= 1 per worker (global rank order); None: every worker at its own speed.
        delay_s: the fixed delay, or the exponential delay's mean (s).
        distribution: none, fixed or exponential.
        shift_s: the exponential delay's shift (s).
        seed: the run's seed.
    """

    def __init__(
        self,
        slowdown: list[float] | None = None,
        delay_s: float = 0.0,
        distribution: str = "none",
        shift_s: float = 0.0,
        seed: int = 0,
    ):
        self.slowdown, self.delay_s, self.distribution, self.shift_s = slowdown, delay_s, distribution, shift_s
        self.seed = seed
        self.factor = 1.0  # this worker's
        self.waited_s = 0.0  # this epoch's sleep
        self._rng: np.random.Generator | None = None
        self._t0: float | None = None  # when this step's compute began
        self._others0 = 0.0  # the strategy's waiting then
        self._cuda = False

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.factor = float(self.slowdown[trainer.global_rank]) if self.slowdown else 1.0
        self._cuda = trainer.strategy.root_device.type == "cuda"

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._rng = np.random.default_rng([self.seed, DRAWS, trainer.global_rank, trainer.current_epoch])
        self._t0 = None  # the step's clock starts at the epoch's first batch (not across its validation)

    def delay(self) -> float:
        """The next extra delay of this worker's stream (s)."""
        if self.distribution == "fixed":
            return self.delay_s
        if self.distribution == "exponential":
            return self.shift_s + float(self._rng.exponential(self.delay_s))
        return 0.0

    def _clock(self, trainer: L.Trainer) -> tuple[float, float]:
        """Now and the strategy's waiting so far (s); on a GPU once the queued kernels are done."""
        if self._cuda:
            torch.cuda.synchronize(trainer.strategy.root_device)
        return time.perf_counter(), trainer.strategy.waited_s if isinstance(trainer.strategy, Reports) else 0.0

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._t0 is None:
            self._t0, self._others0 = self._clock(trainer)

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        now, others = self._clock(trainer)
        compute = max(0.0, now - self._t0 - (others - self._others0))
        sleep = (self.factor - 1.0) * compute + self.delay()
        if sleep > 0:
            time.sleep(sleep)
            self.waited_s += sleep
        self._t0, self._others0 = time.perf_counter(), others  # the next step's clock starts after the sleep

    def take_wait(self) -> float:
        """This epoch's sleep so far (s); it starts anew."""
        waited, self.waited_s = self.waited_s, 0.0
        return waited
