"""The one place psgd touches Lightning's private API: its multiprocessing launcher and the training
loop's per-step SIGTERM broadcast. Keep this file small; it is what a Lightning upgrade may break."""

from typing import Any

import pytorch_lightning as L
import torch
import torch.distributed as dist
from pytorch_lightning.strategies.launchers.multiprocessing import _MultiProcessingLauncher
from pytorch_lightning.utilities.exceptions import SIGTERMException

from psgd.module import STEPS_PER_EPOCH_KEY

__all__ = ["SharedMemoryLauncher", "handle_sigterm_with", "without_per_step_collectives"]


def without_per_step_collectives(trainer: L.Trainer) -> None:
    """Lightning (>= 2.5) broadcasts a SIGTERM flag from rank 0 before every training step. That is a
    per-step collective: workers taking different numbers of steps (uneven shards) would deadlock in
    it. Replace it, for this trainer's loop only, by the same check done locally."""
    loop = trainer.fit_loop.epoch_loop
    if not hasattr(loop, "_broadcast_sigterm_tensor"):
        return

    def local_sigterm_check() -> None:
        if getattr(trainer, "received_sigterm", False):
            raise SIGTERMException()

    loop._broadcast_sigterm_tensor = local_sigterm_check


def handle_sigterm_with(trainer: L.Trainer, handler: Any) -> None:
    """Lightning registers its SIGTERM handler (`_SignalConnector._sigterm_notifier_fn`) in every
    worker when fit starts, after the `setup` hooks. That handler broadcasts a flag from rank 0 from
    inside the signal handler: a collective that the other workers, which no longer broadcast it
    every step (above), never join, so a worker sent SIGTERM waited in it until the process group's
    timeout. Call from a `setup` hook: Lightning then registers `handler` in its place (and keeps
    composing it with a handler set before, as it does its own)."""
    connector = getattr(trainer, "_signal_connector", None)
    if connector is not None and hasattr(connector, "_sigterm_notifier_fn"):
        connector._sigterm_notifier_fn = handler


class SharedMemoryLauncher(_MultiProcessingLauncher):
    """Starts workers with `forkserver` so that module tensors stay shared.

    Lightning's launcher clones every module tensor in `spawn`ed CPU workers
    (`_disable_module_memory_sharing`) and its subprocess launcher re-executes the script: either
    would silently give each worker a private model. With `forkserver` the trainer is pickled by
    torch's reducers, which hand CPU storage over as shared memory, and nothing is cloned; unlike
    `fork`, each worker starts from a clean server process, not a copy of a parent whose OpenMP
    threads may be mid-flight.
    """

    def __init__(self, strategy: Any, prepare: Any):
        super().__init__(strategy, start_method="forkserver")
        self._prepare = prepare

    def launch(self, function, *args: Any, trainer=None, **kwargs: Any) -> Any:
        self._prepare()  # in the launching process, before any worker exists
        return super().launch(function, *args, trainer=trainer, **kwargs)


class PerWorkerCheckpoints:
    """Mixin for strategies whose workers hold different state: a checkpoint stores each worker's
    `per_worker_keys` under `replicas` (rank order), and resuming gives each worker its own. Each
    worker's lr schedule is its own too: with scheduler.interval=step it counts that worker's steps,
    and shards of different lengths give workers different steps per epoch."""

    per_worker_keys: tuple[str, ...] = ("optimizer_states", "lr_schedulers", STEPS_PER_EPOCH_KEY)
    # what the final (averaged) checkpoint gives every worker alike: the average and rank 0's optimizer
    shared_when_averaged = ("state_dict", "optimizer_states")
    _averaged = False

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath, storage_options: Any | None = None) -> None:
        mine = {k: checkpoint[k] for k in self.per_worker_keys if k in checkpoint}
        replicas: list[Any] = [None] * self.world_size
        dist.all_gather_object(replicas, mine)
        if self.is_global_zero:
            checkpoint = {**checkpoint, "replicas": replicas, "averaged": self._averaged}
            super().save_checkpoint(checkpoint, filepath, storage_options)

    def load_checkpoint(self, checkpoint_path, weights_only: bool | None = None) -> dict[str, Any]:
        """The checkpoint as this worker resumes from it: its own replica's keys in place of rank 0's.
        From the final (averaged) checkpoint every worker starts on the average, with its own schedule
        where the worker count is the same (any other count starts on rank 0's)."""
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        replicas = checkpoint.get("replicas")
        if not replicas:
            return checkpoint
        averaged = checkpoint.get("averaged")
        if len(replicas) != self.world_size:
            if averaged:
                return checkpoint
            raise RuntimeError(
                f"checkpoint holds {len(replicas)} workers' state but this run has {self.world_size} workers; "
                "resume with the same number of workers"
            )
        own = replicas[self.global_rank]
        # a key the replicas lack (a checkpoint written before it was kept per worker) stays rank 0's
        keys = [k for k in self.per_worker_keys if k in own and not (averaged and k in self.shared_when_averaged)]
        return {**checkpoint, **{k: own[k] for k in keys}}


def gather_floats(values: list[float], device: torch.device) -> list[list[float]]:
    """Every worker's `values`, in rank order, on every worker."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    out = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return [o.tolist() for o in out]
