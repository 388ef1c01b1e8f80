"""Simulated workers (simulate=true): a strategy's P workers as P replicas in this one process, its algorithm
unchanged, their time projected on a network model.

`simulated(strategy, ...)` turns the Lightning strategy a config built (DDP, model averaging and its family, EASGD,
decentralized SGD) into the same class with `SimulatedWorkers` in front: one process, no process group, and the
algorithm's exchanges done by psgd.strategies.collective.Stacked, tensor operations over the replica dimension.

The replicas. Each parameter of the module is kept for every worker in one stacked tensor [P, ...] (`stacked`),
its gradient likewise (`grads`); the optimizer's param groups hold the stacked tensors, so that one (foreach)
update steps every replica and its state (momentum, Adam's moments) is each replica's own: exact for optimizers
whose update is elementwise, which psgd.config allows alone. For worker r's forward and backward the module's
parameters are made views of row r of both (`replica(r)`), so the backward accumulates into row r. Worker r's
batch is the one its process would train on (psgd.data.ReplicaLoader: the same shard, order and seeds), and its
random stream (dropout, augmentation) is its process's, carried from step to step.

A step: every replica's forward and backward in turn, then what the strategy exchanges (DDP: the gradients'
mean, `exchange_gradients`), then the optimizer's update of all of them, then the strategy's own hook (an
averaging point, a gossip round), as in a worker process. Validation evaluates each replica where they differ
(each worker's on the whole split, as model averaging's processes do), once where they are kept equal (DDP).

Time (psgd.strategies.network): each step adds one replica's share of this machine's time for the step (its
update, data, loop, forwards and backwards, less the algorithm's exchanges) to every simulated worker's clock
(divided by network.compute_scale, times each worker's straggler factor, plus its delay); the strategy's exchanges
join the clocks they wait for and add their time on the α-β model. `sim_epoch_s` and `sim_time_s` are figures of
every epoch (TensorBoard sim/epoch_s, sim/cumulative_s). The strategy object is the one its config built, its class
swapped for the simulated one: the config's `build` is the same for worker processes and simulated workers.
"""

import contextlib
import time
import warnings
from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np
import pytorch_lightning as L
import torch
from torch import Tensor, nn
from typing_extensions import override

from psgd.errors import ConfigError
from psgd.stragglers import DRAWS
from psgd.strategies.collective import Stacked
from psgd.strategies.lightning_internals import InThisProcess
from psgd.strategies.network import Network
from psgd.strategies.records import Reports

REPLICAS_KEY = "psgd_simulated_replicas"  # a checkpoint's stacked parameters of every simulated worker
SIMULATED_KEY = "psgd_simulated"  # a simulated run's checkpoint: its workers' count and clocks


class SimulatedWorkers(InThisProcess, Reports):
    """Lightning strategy mixin (in front of a psgd strategy's class): its workers simulated in this process."""

    figures: ClassVar[dict[str, tuple[str, int]]] = {
        "sim_epoch_s": ("sim/epoch_s", 6),
        "sim_time_s": ("sim/cumulative_s", 6),
    }

    def start_simulation(self, workers: int, network: Network, one_model: bool, stragglers: dict, seed: int) -> None:
        """Simulate `workers` workers on `network`: `one_model`, the strategy keeps them equal (evaluated once);
        `stragglers`, psgd's stragglers.* settings, applied to their clocks."""
        self.comm = Stacked(workers, network)
        self.one_model, self.seed = one_model, seed
        self.slowdown = torch.tensor(stragglers.get("slowdown") or [1.0] * workers, dtype=torch.float64)
        self.delay_s, self.distribution = stragglers.get("delay_s", 0.0), stragglers.get("distribution", "none")
        self.shift_s = stragglers.get("shift_s", 0.0)
        self.stacked: list[nn.Parameter] = []  # each parameter of every worker, [P, ...]
        self.grads: list[Tensor] = []
        self._module_params: list[nn.Parameter] = []
        self._draws: list[np.random.Generator] = []  # each worker's straggler delays, this epoch
        self._epoch_started_s = 0.0  # the simulated time at this epoch's start
        self._mark = (0.0, 0.0)  # when the last step's compute ended, and Stacked.busy_s then
        self._saved: tuple[Any, Any] = (None, None)  # a checkpoint's replicas and clocks, until the replicas exist

    # ---- one process (InThisProcess: no launcher), no process group ----

    @override
    def setup_distributed(self) -> None:
        self.set_world_ranks()  # Lightning's ranks of one process: no process group

    @override
    def configure_ddp(self) -> None:
        pass  # no DDP wrapper: `exchange_gradients` is DDP's all-reduce

    @override
    def setup(self, trainer: L.Trainer) -> None:
        warnings.filterwarnings("ignore", message=r"`training_step` returned `None`")  # the replicas' own backward
        super().setup(trainer)

    @override
    def setup_optimizers(self, trainer: L.Trainer) -> None:
        """The module's optimizers, made to step every replica: the replicas are stacked from the module's
        parameters (every worker starts from the same seed's weights) and take their place in the param groups."""
        super().setup_optimizers(trainer)
        workers = self.comm.size
        self.lightning_module.replicas = workers
        self._module_params = list(self.lightning_module.parameters())
        with torch.no_grad():
            self.stacked = [nn.Parameter(stacked_like(p, workers), p.requires_grad) for p in self._module_params]
        self.grads = [torch.zeros_like(s) for s in self.stacked]
        stacked = {id(p): s for p, s in zip(self._module_params, self.stacked, strict=True)}
        for optimizer in self.optimizers:
            for group in optimizer.param_groups:
                group["params"] = [stacked[id(p)] for p in group["params"]]
        self._restore()  # a checkpoint loaded before the replicas were made
        self._bind(0)

    # ---- the replicas ----

    def replica_params(self) -> list[Tensor]:
        return list(self.stacked)

    def replica_buffers(self) -> list[Tensor]:
        return []  # psgd.config refuses a model with buffers (BatchNorm's running statistics) in simulation

    def _bind(self, rank: int) -> None:
        """The module's parameters and their gradients become views of worker `rank`'s row (and the module
        counts its figures as that worker's)."""
        for p, s, g in zip(self._module_params, self.stacked, self.grads, strict=True):
            p.data = s.data[rank]
            p.grad = g[rank]
        self.lightning_module.replica = rank

    @contextlib.contextmanager
    def replica(self, rank: int) -> Iterator[None]:
        self._bind(rank)
        try:
            yield
        finally:
            self._bind(0)

    # ---- a step ----

    @override
    def training_step(self, batch: tuple[Tensor, Tensor, list[int]], batch_idx: int) -> None:
        """Every replica's forward and backward on its own batch, in its own random stream; then the strategy's
        exchange of gradients (DDP's mean)."""
        x, y, sizes = batch
        streams = self.lightning_module.trainer.train_dataloader.streams
        for g in self.grads:
            g.zero_()
        module = self.lightning_module
        for rank, (x_r, y_r) in enumerate(zip(x.split(sizes), y.split(sizes), strict=True)):
            self._bind(rank)
            module.log_step_counts = rank == len(sizes) - 1  # the step's figures are every worker's batches'
            torch.set_rng_state(streams[rank])
            with self.precision_plugin.train_step_context():
                loss = module.training_step((x_r, y_r), batch_idx)
            loss.backward()
            streams[rank] = torch.get_rng_state()
        self._bind(0)
        now, busy = time.perf_counter(), self.comm.busy_s
        self._compute(now - self._mark[0] - (busy - self._mark[1]))
        self._mark = (now, busy)
        exchange = getattr(self, "exchange_gradients", None)
        if exchange is not None and self.comm.size > 1:  # one worker: a run without a process group, as in a process
            exchange([memory_rows(g) for g in self.grads])

    @override
    def optimizer_step(self, optimizer: Any, closure: Any, model: Any = None, **kwargs: Any) -> Any:
        """The step: Lightning's closure (training_step, then its zero_grad, which unsets the stacked gradients),
        then every replica's gradient handed to the optimizer, which steps them all; then the strategy's hook."""

        def step_then_gradients() -> Any:
            loss = closure()
            for s, g in zip(self.stacked, self.grads, strict=True):
                s.grad = g
            return loss

        return super().optimizer_step(optimizer, step_then_gradients, model, **kwargs)

    def _compute(self, seconds: float) -> None:
        """Every worker's clock advances by this step's compute per replica, times its straggler factor, plus its
        delay: `seconds` is this machine's time since the last step's forwards and backwards (the update, the
        data, Lightning's loop, this step's forwards and backwards: a worker process's step), less the algorithm's
        exchanges (psgd.strategies.collective.Stacked.busy_s), shared by the replicas."""
        workers = self.comm.size
        delays = None
        if self.distribution == "fixed":
            delays = torch.full((workers,), float(self.delay_s), dtype=torch.float64)
        elif self.distribution == "exponential":
            draws = [self.shift_s + float(g.exponential(self.delay_s)) for g in self._draws]
            delays = torch.tensor(draws, dtype=torch.float64)
        self.comm.clocks.compute(seconds / workers, self.slowdown, delays)

    @override
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if batch_idx == 0:
            epoch = self.lightning_module.trainer.current_epoch
            self._draws = [np.random.default_rng([self.seed, DRAWS, r, epoch]) for r in range(self.comm.size)]
            self._epoch_started_s = self.comm.clocks.elapsed()
            self._mark = (time.perf_counter(), self.comm.busy_s)  # the epoch's compute starts at its first batch
        super().on_train_batch_start(batch, batch_idx)

    @override
    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        """One evaluation where the workers are kept equal, else each worker's replica's on the batch."""
        if self.one_model:
            return super().validation_step(*args, **kwargs)
        for rank in self.comm.ranks:
            with self.replica(rank):
                super().validation_step(*args, **kwargs)
        return None

    @override
    def on_train_end(self) -> None:
        """The strategy's end (model averaging's final average is an exchange too), and the run's simulated time
        with it: the end's report, which metrics.json's sim_time_s takes over the last epoch's."""
        super().on_train_end()
        self.report = {**self.report, "sim_time_s": round(self.comm.clocks.elapsed(), 6)}

    # ---- what it records ----

    def simulated_time(self) -> float:
        return self.comm.clocks.elapsed()

    @override
    def epoch_figures(self) -> dict[str, float]:
        """The strategy's figures, and this epoch's and the run's simulated time (s)."""
        now = self.comm.clocks.elapsed()
        return {**super().epoch_figures(), "sim_epoch_s": now - self._epoch_started_s, "sim_time_s": now}

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None) -> None:
        """Every worker's parameters and clock too (the optimizer's state is every worker's already)."""
        replicas = [s.detach().cpu().clone() for s in self.stacked]
        simulated = {"workers": self.comm.size, "clocks": self.comm.clocks.now.clone()}
        checkpoint = {**checkpoint, REPLICAS_KEY: replicas, SIMULATED_KEY: simulated}
        super().save_checkpoint(checkpoint, filepath, storage_options)

    @override
    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        """The checkpoint; every worker's parameters and clock restored from it (where Lightning loads it before
        the replicas are made, DDP's, once they are: setup_optimizers)."""
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        self._saved = (checkpoint.get(REPLICAS_KEY), checkpoint.get(SIMULATED_KEY))
        self._restore()
        return checkpoint

    def _restore(self) -> None:
        replicas, simulated = self._saved
        if replicas is None or not self.stacked:
            return
        with torch.no_grad():
            for s, kept in zip(self.stacked, replicas, strict=True):
                s.copy_(kept)
        self.comm.clocks.now = simulated["clocks"].clone()
        self._saved = (None, None)


GiB = 1024**3
# parameter copies (fp32) of passing work: the replica distance's fp64 rows and their mean (4), an average's fp64
# working copy (2), a checkpoint's copy of the replicas (1); with them 1,024 lab-CNN replicas under model averaging
# were estimated at 9.1 GiB and peaked at 9.4 GiB resident (docs/simulation.md)
WORKSPACE = 7
BASE_BYTES = GiB  # torch, Lightning, the decoded dataset, one replica's activations


def optimizer_copies(settings: dict[str, Any]) -> int:
    """The per-parameter state tensors of the optimizer `settings` (optimizer.*) keeps."""
    name = settings["_target_"].rsplit(".", 1)[-1]
    if name in ("Adam", "AdamW"):
        return 3 if settings.get("amsgrad") else 2
    if name == "RMSprop":
        return 1 + bool(settings.get("momentum")) + bool(settings.get("centered"))
    return int(bool(settings.get("momentum"))) if name == "SGD" else 1


def memory_estimate(parameters: int, workers: int, optimizer: dict[str, Any], strategy_copies: int) -> int:
    """Bytes a run of `workers` simulated workers of `parameters` parameters each takes: per worker its weights,
    gradients, optimizer state, the strategy's copies and the WORKSPACE (fp32), and BASE_BYTES."""
    copies = 2 + optimizer_copies(optimizer) + strategy_copies + WORKSPACE
    return workers * parameters * 4 * copies + BASE_BYTES


def available_memory(device: str) -> int:
    """Free memory where the replicas will live: the GPU's, or this machine's (MemAvailable, Linux)."""
    if device == "gpu":
        return torch.cuda.mem_get_info()[0]
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        import os

        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_simulation(net: nn.Module, model: str, workers: int, optimizer: dict, copies: int, device: str) -> int:
    """The simulated run's memory estimate (bytes), checked before any replica is made.

    Raises:
        ConfigError: the model keeps buffers (BatchNorm's running statistics), or the estimate exceeds the
            memory available.
    """
    buffers = [name for name, _ in net.named_buffers()]
    if buffers:
        raise ConfigError(
            f"model={model} is invalid with simulate=true: it keeps buffers ({', '.join(buffers[:3])}: BatchNorm's "
            "running statistics), which simulated workers do not keep per worker; use a model without BatchNorm "
            "(model=lab_cnn, model.batch_norm=false) or simulate=false"
        )
    parameters = sum(p.numel() for p in net.parameters())
    need, free = memory_estimate(parameters, workers, optimizer, copies), available_memory(device)
    if need > free:
        raise ConfigError(
            f"workers={workers} is invalid with simulate=true here: {workers} replicas of model={model} "
            f"({parameters / 1e6:.2f} M parameters each, with gradients, optimizer state and the strategy's copies) "
            f"need about {need / GiB:.1f} GiB and this machine has {free / GiB:.1f} GiB available; use fewer workers "
            "or a smaller model"
        )
    return need


def stacked_like(p: Tensor, workers: int) -> Tensor:
    """`workers` copies of `p` stacked, [workers, ...], each row with p's strides (a channels_last conv weight stays
    channels_last: the convolution, and its rounding, are a worker process's). p must be dense."""
    out = torch.empty_strided((workers, *p.shape), (p.numel(), *p.stride()), dtype=p.dtype, device=p.device)
    out.copy_(p.detach().unsqueeze(0).expand_as(out))
    return out


def memory_rows(stacked: Tensor) -> Tensor:
    """A stacked tensor (stacked_like's) as rows [P, numel], each row its worker's entries in memory order (as a
    worker process's DDP bucket holds them): a view."""
    n = stacked[0].numel()
    return stacked.as_strided((len(stacked), n), (n, 1))


_CLASSES: dict[type, type] = {}


def simulated_class(cls: type) -> type:
    """`cls` with SimulatedWorkers in front (one class per strategy class)."""
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"Simulated{cls.__name__}", (SimulatedWorkers, cls), {})
    return _CLASSES[cls]


def simulated(strategy: Any, workers: int, network: Network, one_model: bool, stragglers: dict, seed: int) -> Any:
    """The Lightning `strategy` a strategy's config built, its workers simulated (SimulatedWorkers)."""
    strategy.__class__ = simulated_class(type(strategy))
    strategy.start_simulation(workers, network, one_model, stragglers, seed)
    return strategy
