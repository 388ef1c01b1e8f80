"""Elastic averaging SGD (Zhang, Choromanska and LeCun, 2015, "Deep learning with Elastic Averaging SGD").

Each of p workers runs SGD on its own shard, as in model averaging, and every worker keeps a copy of the centre
variable x̃ (identical everywhere). Every τ optimizer steps, with x̄ the all-reduced mean of the workers' x_i:

    e_i = α (x_i - x̃);   x_i <- x_i - e_i;   x̃ <- x̃ + p α (x̄ - x̃)   (= x̃ + Σ_i e_i)

so x̃ + Σ_i x_i is unchanged by an elastic step. β = p α is the paper's moving rate (default 0.9, so α = 0.9 / p
by default); τ ∈ {1, 4, 16, 64} in the paper. EAMSGD is this with Nesterov momentum in the inner optimizer
(optimizer.nesterov=true). The centre is what is evaluated, tested and saved at the end; each worker's own
accuracy is reported beside it. The elastic steps follow model averaging's counting (the steps every worker
takes), so uneven shards never hang.
"""

from typing import Any

import pytorch_lightning as L
import torch
from torch import Tensor
from typing_extensions import override

from psgd.strategies.model_averaging import ModelAveragingStrategy

CENTRE_KEY = "psgd_centre"  # a checkpoint's centre variable (the same on every worker)


class ElasticAveragingStrategy(ModelAveragingStrategy):
    """EASGD: every `tau` steps each replica moves α of the way to the centre and the centre p α of the way to
    the replicas' mean; the centre is the final model."""

    strategy_name = "elastic_averaging"

    def __init__(self, tau: int = 8, alpha: float | None = None, **kwargs: Any):
        super().__init__(period=None, **kwargs)
        self.tau, self.alpha_setting = tau, alpha
        self.alpha = 0.0  # α: set in setup, where the workers are known (default 0.9 / p)
        self.centre: list[Tensor] = []

    @override
    def setup(self, trainer: L.Trainer) -> None:
        super().setup(trainer)
        self.alpha = 0.9 / self.workers if self.alpha_setting is None else self.alpha_setting
        self.centre = [p.detach().clone() for p in self.replica_params()]  # every worker's copy of x̃
        self.comm.mean_(self.centre, counted=False)  # x̃ starts at the replicas' mean (rank 0's under same_init)

    @override
    def settings(self) -> dict[str, Any]:
        return {"tau": self.tau, "alpha": self.alpha}

    @override
    def averages_at(self, done: int) -> bool:
        return done % self.tau == 0

    @override
    def averagings(self, done: int) -> int:
        """The elastic steps of the first `done` common steps: one every tau."""
        return done // self.tau

    @override
    def _sync(self) -> None:
        """The elastic step; its all-reduce counted."""
        params = self.replica_params()
        mean = [p.detach().clone() for p in params]
        sent = self.comm.mean_(mean)
        with torch.no_grad():
            for x, centre, x_bar in zip(params, self.centre, mean, strict=True):
                x.sub_(self.alpha * (x - centre))  # x_i <- x_i - α (x_i - x̃), with the x̃ before its move
                centre.add_(self.workers * self.alpha * (x_bar - centre))
        self._count(sent, int(sent > 0))

    @override
    def _finish(self) -> None:
        """Every worker takes the centre as its weights (and the mean of the floating buffers)."""
        with torch.no_grad():
            for x, centre in zip(self.replica_params(), self.centre, strict=True):
                x.copy_(centre)
        if self.average_buffers:
            sent = self.comm.mean_(self.replica_buffers())
            self._count(sent, int(sent > 0))

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None) -> None:
        centre = [t.detach().cpu().clone() for t in self.centre]  # (simulated workers: every worker's copy)
        super().save_checkpoint({**checkpoint, CENTRE_KEY: centre}, filepath, storage_options)

    @override
    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        for centre, kept in zip(self.centre, checkpoint.get(CENTRE_KEY) or [], strict=False):
            centre.copy_(kept)
        return checkpoint

    @classmethod
    @override
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register(
            cls.strategy_name, cls, description="elastic averaging SGD (EASGD)", start_method="spawn"
        )
