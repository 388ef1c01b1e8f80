"""HogWild! (Niu, Recht, Re and Wright, 2011, "HOGWILD!: A Lock-Free Approach to Parallelizing
Stochastic Gradient Descent"): asynchronous SGD on parameters in shared memory, without locks.

One model lives in shared memory. Each worker process runs its own optimizer (its own gradients and
state, as in pytorch/examples' mnist_hogwild) over its own shard and writes its updates straight into
the shared parameters, with no lock and no communication. ``lock=True`` is the consistent baseline:
gradients in parallel, each update written under one lock (its wait: ``hogwild/lock_wait_s``).

Staleness (``hogwild/staleness``): how many other workers' updates landed between a worker's read of
the weights and its own write, from a shared update counter.

``shared_queue=True`` deals the epoch's batches (every shard's, in turn) to whichever worker asks next, as the
paper's processors each sample from the whole data: a faster worker takes more of them, and an epoch ends when
they are all taken, not when the slowest worker is through a shard as large as the others'.
"""

import multiprocessing
import time
from collections.abc import Iterator
from itertools import zip_longest
from typing import Any, ClassVar

import pytorch_lightning as L
import torch
from pytorch_lightning.strategies import DDPStrategy
from typing_extensions import override

from psgd.strategies.lightning_internals import SharedMemoryLaunch, without_per_step_collectives
from psgd.strategies.records import Reports
from psgd.strategies.workers import GroupEndsAtExit, PerWorkerCheckpoints, gather_floats, over_workers


class SharedQueue:
    """A worker's sampler that takes the epoch's batches from a queue every worker shares: the batches of every
    shard (of `sampler`, a ShardSampler), in turn, and a counter in shared memory of those taken. It has no
    length: Lightning then ends a worker's epoch, and validates, when the queue is empty."""

    on_demand = True  # TensorLoader makes each batch as it is taken

    def __init__(self, sampler: Any, taken: torch.Tensor, lock: Any):
        self.sampler, self.taken, self.lock = sampler, taken, lock  # taken: one counter per epoch parity
        self.epoch = 0  # the training epoch (the sampler's may stay 0: overfit_batches)

    def set_epoch(self, epoch: int) -> None:
        """Also makes the next epoch's counter 0: no worker can be taking from it (the workers meet at every
        epoch's end, and the current epoch's is the other one)."""
        self.sampler.set_epoch(epoch)
        self.epoch = epoch
        self.taken[(epoch + 1) % 2] = 0

    def batches(self) -> list[torch.Tensor]:
        """The epoch's batches in the order they are dealt: each shard's first, then each shard's second ..."""
        size = self.sampler.batch_size
        per_shard = [list(s.split(size)) for s in self.sampler.shards()]
        if self.sampler.drop_last:
            per_shard = [[b for b in batches if len(b) == size] for batches in per_shard]
        return [b for turn in zip_longest(*per_shard) for b in turn if b is not None]

    def __iter__(self) -> Iterator[torch.Tensor]:
        batches, slot = self.batches(), self.epoch % 2
        while True:
            with self.lock:
                i = int(self.taken[slot])
                self.taken[slot] = i + 1
            if i >= len(batches):
                return
            yield batches[i]


class HogwildStrategy(SharedMemoryLaunch, PerWorkerCheckpoints, GroupEndsAtExit, Reports, DDPStrategy):
    """Workers share one CPU model and update it without locks; each keeps its own optimizer and lr
    schedule (PerWorkerCheckpoints)."""

    figures: ClassVar[dict[str, tuple[str, int]]] = {
        "staleness": ("hogwild/staleness", 4),
        "lock_wait_s": ("hogwild/lock_wait_s", 6),
    }

    strategy_name = "hogwild"

    def __init__(self, lock: bool = False, shared_queue: bool = False, **ddp_kwargs: Any):
        ddp_kwargs["start_method"] = "forkserver"
        super().__init__(**ddp_kwargs)
        self.lock, self.shared_queue = lock, shared_queue
        self._taken: torch.Tensor | None = None  # shared_queue: batches taken, by epoch parity
        self._queue_lock = None
        self.report: dict[str, Any] = {}
        self._update_lock = None
        self._version: torch.Tensor | None = None  # shared: updates written so far, by anyone
        self._updates: torch.Tensor | None = None  # shared: updates written, per worker
        self._staleness_sum = 0
        self._staleness_count = 0
        self._lock_wait_s = 0.0  # lock=True: this epoch's time waiting for the update lock
        self.waited_s = 0.0  # lock=True: the time waiting for the update lock since the start (s)

    @override
    def share(self) -> None:
        """In the launching process: put the model and the counters in shared memory."""
        self.model.share_memory()
        self._version = torch.zeros(1, dtype=torch.int64).share_memory_()
        self._updates = torch.zeros(self.num_processes * self.num_nodes, dtype=torch.int64).share_memory_()
        context = multiprocessing.get_context("forkserver")
        self._update_lock = context.Lock() if self.lock else None
        if self.shared_queue:
            self._taken = torch.zeros(2, dtype=torch.int64).share_memory_()
            self._queue_lock = context.Lock()

    @override
    def process_dataloader(self, dataloader: Any) -> Any:
        """With shared_queue, the training loader takes its batches from the queue every worker shares."""
        if self._taken is not None and hasattr(getattr(dataloader, "sampler", None), "shards"):
            dataloader.sampler = SharedQueue(dataloader.sampler, self._taken, self._queue_lock)
        return dataloader

    @override
    def configure_ddp(self) -> None:
        pass  # no DDP wrapper: nothing is all-reduced; every write goes straight to the shared weights

    @override
    def setup(self, trainer: L.Trainer) -> None:
        super().setup(trainer)
        without_per_step_collectives(trainer)

    @override
    def optimizer_step(self, optimizer, closure, model=None, **kwargs: Any) -> Any:
        read = int(self._version.item())  # the forward pass (inside `closure`) reads the weights after this
        if self._update_lock is None:
            output = super().optimizer_step(optimizer, closure, model, **kwargs)
        else:
            held = False

            def closure_then_lock():
                nonlocal held
                result = closure()  # gradients in parallel ...
                start = time.perf_counter()
                self._update_lock.acquire()  # ... then one write at a time
                held = True
                waited = time.perf_counter() - start
                self._lock_wait_s += waited
                self.waited_s += waited
                return result

            try:
                output = super().optimizer_step(optimizer, closure_then_lock, model, **kwargs)
            finally:
                if held:
                    self._update_lock.release()
        written = int(self._version.add_(1).item())  # not atomic: a measure, not a lock
        self._updates[self.global_rank] += 1
        self._staleness_sum += max(0, written - read - 1)
        self._staleness_count += 1
        return output

    @override
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if batch_idx == 0:
            self._staleness_sum = self._staleness_count = 0
        super().on_train_batch_start(batch, batch_idx)

    @override
    def epoch_figures(self) -> dict[str, float]:
        """This epoch's mean staleness (and, with lock=True, wait for the lock in s) over the workers; the
        lock's wait starts anew."""
        own = [self._staleness_sum / max(1, self._staleness_count), self._lock_wait_s]
        self._lock_wait_s = 0.0
        staleness, lock_wait_s = (v / self.world_size for v in over_workers(own, self.root_device))
        return {"staleness": staleness, **({"lock_wait_s": lock_wait_s} if self.lock else {})}

    @override
    def on_train_end(self) -> None:
        """Once every worker has stopped writing: record what each sees of the weights, and probe the
        sharing itself."""
        self.barrier("hogwild-end")
        module = self.lightning_module
        params = list(module.parameters())
        checksum = float(sum(p.detach().double().sum() for p in params))
        saw_write = self._probe_sharing(params[0].detach())
        seen = gather_floats(
            [checksum, float(int(self._updates[self.global_rank])), float(saw_write)], self.root_device
        )
        self.report = {
            "lock": self.lock,
            "updates_per_worker": [int(s[1]) for s in seen],
            "total_updates": int(self._version.item()),
            "weight_checksum_per_worker": [s[0] for s in seen],
            "saw_other_workers_write": [bool(s[2]) for s in seen],
        }
        self.save_final_checkpoint()  # with these figures
        super().on_train_end()

    @torch.no_grad()
    def _probe_sharing(self, weights: torch.Tensor) -> bool:
        """The last worker writes a sentinel into one weight: whether this worker sees it."""
        writer, sentinel = self.world_size - 1, 12345.0
        first = (0,) * weights.dim()
        original = weights[first].clone()
        self.barrier("probe-read")
        if self.global_rank == writer:
            weights[first] = sentinel
        self.barrier("probe-write")
        seen = float(weights[first]) == sentinel
        self.barrier("probe-check")
        if self.global_rank == writer:
            weights[first] = original  # leave the model as training left it
        self.barrier("probe-undo")
        return seen

    @classmethod
    @override
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register(cls.strategy_name, cls, description="HogWild! lock-free shared-memory SGD")
