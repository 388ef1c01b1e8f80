"""Model averaging: one-shot parameter averaging (Zinkevich, Weimer, Smola and Li, 2010, "Parallelized
Stochastic Gradient Descent") and periodic averaging, a.k.a. local SGD (Stich, 2019, "Local SGD
Converges Fast and Communicates Little"; Lin et al., 2018, "Don't Use Large Mini-Batches, Use Local SGD"),
with post-local SGD's synchronous start (Lin et al.: average after each of the first ``sync_steps`` steps)
and an outer optimizer at each averaging point (DiLoCo, Douillard et al., 2023).

Each of k workers runs SGD on its own shard, with no gradient communication; the replicas' parameters
are then averaged: once when training ends with ``period=None`` (SimuParallelSGD), also after every K
optimizer steps with ``period=K`` (local SGD). Averaged: the parameters, floating buffers such as
BatchNorm statistics (``average_buffers``), optionally the optimizer's floating state
(``average_optimizer_state``).

With an outer optimizer every worker keeps θ_g, the weights at the last averaging point (identical on every
worker); at an averaging point Δ = θ_g - mean_i θ_i (one all-reduce), each worker restores θ_g, takes one
outer step with Δ as the gradient, and θ_g becomes the result; the inner optimizer's state stays each worker's.
Outer SGD with lr 1 and no momentum is plain averaging. Training that ends between two averaging points ends
with an outer step over the partial round, so the final model is the outer model θ_g (the paper's); where no
replica moved from θ_g since the last point, they are θ_g already and no step is taken.

Hierarchical averaging (``group_periods``, the semantics of torch's HierarchicalModelAverager): at each step the
replicas average within the largest group of consecutive ranks whose period divides it, the largest group all
workers.

The period runs across epochs. With uneven shards only each epoch's first F steps count towards it, F
the fewest steps any worker takes in an epoch (computed locally from the partition), so every worker
reaches every averaging point.
"""

import contextlib
import functools
import math
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytorch_lightning as L
import torch
from torch import Tensor, nn
from typing_extensions import override

from psgd.data.partition import limited_batches
from psgd.io import save_atomic
from psgd.strategies.ddp import Workers
from psgd.strategies.workers import PerWorkerCheckpoints

OUTER_KEY = "psgd_outer"  # a checkpoint's θ_g and outer optimizer state


def floating_buffers(module: nn.Module) -> list[Tensor]:
    return [b for b in module.buffers() if b.is_floating_point()]


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> list[Tensor]:
    """The floating per-parameter state (momentum, moments), in a fixed order on every worker."""
    out = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            for key in sorted(state):
                value = state[key]
                if key != "step" and torch.is_tensor(value) and value.is_floating_point():
                    out.append(value)
    return out


def common_steps(batches: list[int], limit_train_batches: int | float | None, accumulate: int) -> int:
    """F: the optimizer steps every worker takes in an epoch, from each worker's batches per epoch."""
    if limit_train_batches is not None:
        batches = [limited_batches(b, limit_train_batches) for b in batches]
    # Lightning steps after an epoch's last batch whatever the accumulation holds
    return math.ceil(min(batches) / accumulate)


class ModelAveragingStrategy(PerWorkerCheckpoints, Workers):
    """Train one replica per worker without gradient sync; average the parameters every `period` steps
    and after fit.

    The algorithm reads and writes the workers' replica tensors (`replica_params`, `replica_buffers`, the
    optimizer's state) and exchanges them through `comm` (psgd.strategies.collective), so that it trains worker
    processes and simulated workers alike; `replica(rank)` makes the module that worker's replica."""

    figures: ClassVar[dict[str, tuple[str, int]]] = {
        "averaging_s": ("averaging/time_s", 6),
        "replica_distance": ("averaging/replica_distance", 6),
    }

    strategy_name = "model_averaging"
    per_worker_keys = ("state_dict", *PerWorkerCheckpoints.per_worker_keys)  # replicas differ

    def __init__(
        self,
        period: int | None = None,
        same_init: bool = True,
        average_buffers: bool = True,
        average_optimizer_state: bool = False,
        seed: int = 0,
        replica_dir: str | None = None,
        sync_steps: int = 0,
        outer_optimizer: Callable[[Iterable[Tensor]], torch.optim.Optimizer] | None = None,
        group_periods: dict[int, int] | None = None,
        **ddp_kwargs: Any,
    ):
        if period is not None and (isinstance(period, bool) or not isinstance(period, int) or period < 1):
            raise ValueError(f"period={period!r} is invalid: must be an integer >= 1, or None for only at the end")
        super().__init__(**ddp_kwargs)
        self.period, self.same_init, self.seed = period, same_init, seed
        self.average_buffers, self.average_optimizer_state = average_buffers, average_optimizer_state
        self.replica_dir = replica_dir
        self.sync_steps = sync_steps  # t0: the first t0 steps average after every step
        self.outer_factory = outer_optimizer
        # hierarchical averaging: group size -> its period, the largest group all workers; {} without
        self.group_periods = dict(sorted((group_periods or {}).items()))
        self.outer: torch.optim.Optimizer | None = None  # built in setup, over the module's parameters
        self.start: list[Tensor] = []  # θ_g, with an outer optimizer
        self.report: dict[str, Any] = {}
        self._steps_in_epoch = 0
        self._common_steps = 0  # F: the steps every worker takes in an epoch
        self._common_before = 0  # the steps every worker took in the epochs before this one
        self._averaged = False  # True once the final averaging has made every replica equal
        self._averaging_s = 0.0  # this epoch's time in periodic averaging
        self.waited_s = 0.0  # the time in periodic averaging since the start: waiting for the others (s)
        self._comm: list[list[int]] = []  # each worker's (held here) bytes and exchanges, this epoch or the end's

    @property
    @override
    def restore_checkpoint_after_setup(self) -> bool:
        return True  # each worker's own replica is restored after `setup` broadcast rank 0's weights

    @override
    def configure_ddp(self) -> None:
        pass  # no DDP wrapper: the replicas must not all-reduce gradients

    @property
    def workers(self) -> int:
        """P, every worker of the run."""
        return self.comm.size

    def replica_params(self) -> list[Tensor]:
        """The workers' parameters as replica tensors (this process's module's own, where it is one worker)."""
        return list(self.lightning_module.parameters())

    def replica_buffers(self) -> list[Tensor]:
        """The workers' floating buffers (BatchNorm statistics) as replica tensors."""
        return floating_buffers(self.lightning_module)

    @contextlib.contextmanager
    def replica(self, rank: int) -> Iterator[None]:
        """The module is worker `rank`'s replica inside (this process's own worker: always)."""
        yield

    def _count(self, sent: int | list[int], calls: int | list[int]) -> None:
        """Add to each worker's bytes and exchanges (a number: the same for every worker held here)."""
        rows = len(self.comm.ranks)
        sent = sent if isinstance(sent, list) else [sent] * rows
        calls = calls if isinstance(calls, list) else [calls] * rows
        self._comm = [[b + s, c + n] for (b, c), s, n in zip(self._comm or [[0, 0]] * rows, sent, calls, strict=True)]

    @override
    def setup(self, trainer: L.Trainer) -> None:
        super().setup(trainer)
        net = self.lightning_module
        if self.same_init:
            self.comm.broadcast_([*self.replica_params(), *self.replica_buffers()])
        else:  # independent initialisations
            for rank in self.comm.ranks:
                with self.replica(rank), torch.random.fork_rng(devices=[]):
                    torch.manual_seed(self.seed + 1 + rank)
                    for m in net.modules():
                        if hasattr(m, "reset_parameters") and m is not net:
                            m.reset_parameters()
        self.comm.prepare_groups(list(self.group_periods))
        if self.outer_factory is not None:  # θ_g: the replicas' mean (rank 0's weights under same_init)
            self.start = [p.detach().clone() for p in self.replica_params()]
            self.comm.mean_(self.start, counted=False)
            self.outer = self.outer_factory(self.replica_params())

    def _average(self, outer: bool = False, group_size: int | None = None, final: bool = False) -> None:
        """Average the replicas' parameters (and buffers, optimizer state as set) within groups of `group_size`
        (None: all workers), counted in `_comm`; `outer`: the parameters take an outer step from θ_g instead
        (`final`: only where some replica moved from θ_g since the last averaging point)."""
        tensors = [] if outer else self.replica_params()
        if self.average_buffers:
            tensors += self.replica_buffers()
        if self.average_optimizer_state:
            for opt in self.optimizers:
                tensors += optimizer_state_tensors(opt)
        sent = self.comm.mean_(tensors, group_size)
        calls = int(sent > 0)
        if outer:
            outer_sent = self._outer_step(final)
            sent, calls = sent + outer_sent, calls + int(outer_sent > 0)
        self._count(sent, calls)

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None) -> None:
        """With an outer optimizer, θ_g and the outer optimizer's state too (the same on every worker)."""
        if self.outer is not None:
            outer = {"start": [t.detach().cpu().clone() for t in self.start], "optimizer": self.outer.state_dict()}
            checkpoint = {**checkpoint, OUTER_KEY: outer}
        super().save_checkpoint(checkpoint, filepath, storage_options)

    @override
    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        """The checkpoint (each worker's own replica); θ_g and the outer optimizer's state restored from it."""
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        saved = checkpoint.get(OUTER_KEY)
        if self.outer is not None and saved is not None:
            for start, kept in zip(self.start, saved["start"], strict=True):
                start.copy_(kept)
            self.outer.load_state_dict(saved["optimizer"])
        return checkpoint

    def _outer_step(self, final: bool = False) -> int:
        """DiLoCo's outer step: Δ = θ_g - mean_i θ_i as each parameter's gradient, from θ_g; θ_g <- the result.
        `final`: the step is taken only where some replica moved from θ_g since the last averaging point (a flag
        all-reduced with the parameters), else the replicas stay θ_g. Returns the bytes all-reduced."""
        params, rows = self.replica_params(), self.comm.rows
        mean = [p.detach().clone() for p in params]
        moved = []  # at the end: whether each replica moved from θ_g, averaged into whether any did
        if final:
            away = [(rows(p.detach()) != rows(start)).any(1) for p, start in zip(params, self.start, strict=True)]
            moved.append(torch.stack(away).any(0).float())
        sent = self.comm.mean_(mean + moved)
        if moved and moved[0][0].item() == 0:
            return sent
        for p, start, m in zip(params, self.start, mean, strict=True):
            p.detach().copy_(start)
            p.grad = start - m
        self.outer.step()
        self.outer.zero_grad(set_to_none=True)
        for p, start in zip(params, self.start, strict=True):
            start.copy_(p.detach())
        return sent

    @override
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if batch_idx == 0:
            self._steps_in_epoch = 0
            self._common_steps = self._fewest_steps()
            self._common_before = self.lightning_module.trainer.current_epoch * self._common_steps
        super().on_train_batch_start(batch, batch_idx)

    def _fewest_steps(self) -> int:
        """F, computed locally from the partition."""
        trainer = self.lightning_module.trainer
        sampler = getattr(trainer.train_dataloader, "sampler", None)
        counts = sampler.counts() if hasattr(sampler, "counts") else [trainer.num_training_batches]
        return common_steps(counts, trainer.limit_train_batches, trainer.accumulate_grad_batches)

    @override
    def optimizer_step(self, optimizer, closure, model=None, **kwargs: Any) -> Any:
        output = super().optimizer_step(optimizer, closure, model, **kwargs)
        self._steps_in_epoch += 1
        if self._averages_now():
            self._timed_sync()
        return output

    def _averages_now(self) -> bool:
        """Whether the step just counted is an averaging point: one of the epoch's common steps that
        `averages_at`."""
        return self._steps_in_epoch <= self._common_steps and self.averages_at(self._common_done())

    def _timed_sync(self) -> None:
        """`_sync`, its time counted as this epoch's averaging and as waiting for the others."""
        start = time.perf_counter()
        self._sync()
        spent = time.perf_counter() - start
        self._averaging_s += spent
        self.waited_s += spent

    def _sync(self) -> None:
        """What an averaging point does: average (in hierarchical averaging, within the largest group whose
        period has come), or with an outer optimizer take its step."""
        done = self._common_done()
        sizes = [size for size, period in self.group_periods.items() if done % period == 0]
        self._average(outer=self.outer is not None, group_size=sizes[-1] if sizes else None)

    def settings(self) -> dict[str, Any]:
        """The schedule, as metrics.json records it."""
        outer = type(self.outer).__name__ if self.outer is not None else None
        groups = {str(k): v for k, v in self.group_periods.items()} or None
        return {"period": self.period, "sync_steps": self.sync_steps, "outer_optimizer": outer, "group_periods": groups}

    def _finish(self) -> None:
        """What the end of training does to the replicas: the final average; with an outer optimizer, the outer
        step over the round since the last averaging point."""
        self._average(outer=self.outer is not None, final=True)

    def averages_at(self, done: int) -> bool:
        """Whether the replicas average after common step `done` (from 1): each of the first sync_steps, then
        every period; in hierarchical averaging, where some group's period divides it."""
        if self.group_periods:
            return any(done % period == 0 for period in self.group_periods.values())
        return done <= self.sync_steps or bool(self.period and done % self.period == 0)

    def averagings(self, done: int) -> int:
        """The averagings of the first `done` common steps: one after each of the first sync_steps, then
        one every period (none without a period); in hierarchical averaging, one at every step some group's
        period divides."""
        if self.group_periods:
            return sum(map(self.averages_at, range(1, done + 1)))
        synchronous = min(done, self.sync_steps)
        periodic = done // self.period - self.sync_steps // self.period if self.period and done > self.sync_steps else 0
        return synchronous + periodic

    def _common_done(self) -> int:
        """The steps every worker has taken so far in the run, the epochs before a resume included."""
        return self._common_before + min(self._steps_in_epoch, self._common_steps)

    def periodic_averagings(self) -> int:
        """The averagings during training so far, a resumed run's earlier ones included."""
        return self.averagings(self._common_done())

    @override
    def comm_count(self) -> list[list[float]]:
        """Each worker's [payload bytes, bytes sent, collectives, seconds] of its averagings since the last call
        (the seconds are this epoch's, which epoch_figures starts anew)."""
        counts, self._comm = self._comm or [[0, 0]] * len(self.comm.ranks), []
        return [[sent, sent, calls, self._averaging_s] for sent, calls in counts]

    def _distance_from_mean(self) -> list[float]:
        """Each replica's L2 distance from the replicas' mean parameters (an all-reduce of the parameters, not
        the algorithm's), a row per worker held here."""
        mine = self.comm.flat(self.replica_params(), torch.float64)
        mean = mine.clone()
        self.comm.mean_([mean], counted=False)
        return (mine - mean).norm(dim=1).tolist()

    @override
    def epoch_figures(self) -> dict[str, float]:
        """This epoch's end: the replicas' mean distance from their mean (`replica_distance`) and, with a
        period, the mean time in periodic averaging over the workers (s; it starts anew)."""
        spent, self._averaging_s = self._averaging_s, 0.0
        total, distance = self.comm.total([[spent, d] for d in self._distance_from_mean()])
        figures = {"replica_distance": distance / self.workers}
        return figures | ({"averaging_s": total / self.workers} if self.period else {})

    @override
    def on_train_end(self) -> None:
        """After the last validation and checkpoint: evaluate each replica, average, then evaluate and
        checkpoint the average, so the final figures and files are the average's."""
        module, trainer = self.lightning_module, self.lightning_module.trainer
        if self.replica_dir is not None:
            Path(self.replica_dir).mkdir(parents=True, exist_ok=True)
            for rank in self.comm.ranks:
                with self.replica(rank):
                    state = {k: v.detach().clone() for k, v in module.state_dict().items()}
                save_atomic(state, Path(self.replica_dir) / f"rank{rank}.pt")
        # a LightningModule of the user's own is averaged all the same, without these figures
        evaluates = callable(getattr(module, "evaluate", None)) and hasattr(trainer.datamodule, "full_eval_loader")
        replicas = self.comm.gather(self._evaluate_replicas("test")) if evaluates else []
        (distance,) = self.comm.total([[d] for d in self._distance_from_mean()])
        start = time.perf_counter()
        self._finish()
        self._averaging_s = time.perf_counter() - start
        self._averaged = True
        self.report = {
            "comm_at_end": self.comm.gather(self.comm_count()),  # the final averaging's
            "replica_distance": round(distance / self.workers, 6),
            **self.settings(),
            "periodic_averagings": self.periodic_averagings(),
            "same_init": self.same_init,
        }
        values = {}  # (TensorBoard has the replica distance at each epoch's end)
        if evaluates:
            val_acc, val_loss = self._evaluate("val")
            self.report = {
                "averaged_val_acc": None if val_acc is None else round(val_acc, 6),
                "averaged_val_loss": None if val_loss is None else round(val_loss, 6),
                "worker_test_acc": [round(acc, 6) for acc, _ in replicas],
                "worker_test_loss": [round(loss, 6) for _, loss in replicas],
                **self.report,
            }
            if val_acc is not None:  # the averaged model's own tags: val/* are the replicas' mean
                values |= {"averaged/val_acc": val_acc, "averaged/val_loss": val_loss}
            for r, (acc, loss) in enumerate(replicas):
                values[f"worker/{r}/test_acc"], values[f"worker/{r}/test_loss"] = acc, loss
        if values and trainer.logger is not None and trainer.is_global_zero:
            trainer.logger.log_metrics(values, step=trainer.global_step)
        self.save_final_checkpoint()  # the average, with the report
        super().on_train_end()

    def _evaluate_replicas(self, split: str) -> list[list[float | None]]:
        """Each worker's replica (held here) on the whole `split`: a row [accuracy, loss] per worker."""
        rows = []
        for rank in self.comm.ranks:
            with self.replica(rank):
                rows.append(list(self._evaluate(split)))
        return rows

    def _evaluate(self, split: str) -> tuple[float | None, float | None]:
        """This process's model on the whole `split` ("val" or "test"), as far as trainer.limit_<split>_batches
        lets Lightning's own loop go: (accuracy, loss), or (None, None) where it allows no batch."""
        trainer = self.lightning_module.trainer
        loader = trainer.datamodule.full_eval_loader(split)
        batches = limited_batches(len(loader), getattr(trainer, f"limit_{split}_batches"))
        return self.lightning_module.evaluate(loader, batches) if batches else (None, None)

    @classmethod
    @override
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register(
            cls.strategy_name, cls, description="one-shot / periodic model averaging", start_method="spawn"
        )
        strategy_registry.register(  # conf/strategy/diloco.yaml's: an outer Nesterov step every 64 steps
            "diloco",
            cls,
            description="DiLoCo: local SGD with an outer Nesterov step at each averaging point",
            start_method="spawn",
            period=64,
            outer_optimizer=functools.partial(torch.optim.SGD, lr=0.7, momentum=0.9, nesterov=True),
        )
