"""Decentralized SGD on a graph: D-PSGD (Lian et al., 2017, "Can Decentralized Algorithms Outperform Centralized
Algorithms? A Case Study for Decentralized Parallel Stochastic Gradient Descent") and its compressed gossip,
CHOCO-SGD (Koloskova, Stich and Jaggi, 2019, "Decentralized Stochastic Optimization and Gossip Algorithms with
Compressed Communication").

Each of P workers trains its own replica x_i on its own shard, as in model averaging, but no worker ever averages
over all of them: every `gossip_every` optimizer steps each one mixes its parameters with its neighbours' on a
graph, by a doubly stochastic mixing matrix W (W_ij > 0 only where j is i or one of i's neighbours):

    D-PSGD, Algorithm 1 (order=mix_then_step):  x_i <- sum_j W_ij x_j - lr g_i(x_i)   (the gradient at the unmixed x_i)
    order=step_then_mix (Koloskova et al., 2020, "A Unified Theory of Decentralized SGD"):
                                                x_i <- sum_j W_ij (x_j - lr g_j(x_j))

CHOCO-SGD (compression topk, sign or qsgd; its paper's order, step then gossip) keeps public copies x̂: worker i
holds x̂_i and s_i = sum_j W_ij x̂_j (both 0 at the start, as in the paper), sends q_i = C(x_i - x̂_i) to its
neighbours, and with theirs

    x̂_i <- x̂_i + q_i;   s_i <- s_i + sum_j W_ij q_j;   x_i <- x_i + γ (s_i - x̂_i)     (γ: consensus_lr)

so with C the identity and γ = 1 it is D-PSGD in the step-then-mix order.

The graphs (`mixing_matrix`): ring, 2-D torus, complete and a random matching drawn per gossip round (undirected:
W symmetric, uniform weights 1/(d_max + 1) or Metropolis-Hastings 1/(1 + max(d_i, d_j))); the static exponential
graph and its one-peer, time-varying form (Ying et al., 2021, "Exponential Graph is Provably Efficient for
Decentralized Deep Training": directed, each worker pulling from the workers 2^k ahead). A worker receives from
the j with W_ij > 0 and sends to the k with W_ki > 0, by point-to-point sends and receives, and counts the bytes
it sends. ρ = ||W - 11^T/P||_2 (for the time-varying graphs: the rate per round over a cycle of one-peer rounds,
the root of the expected contraction for random matchings) is the mixing rate, 1 - ρ the spectral gap.

The rounds follow model averaging's counting (the steps every worker takes), so uneven shards never hang; the
consensus distance (1/P) sum_i ||x_i - x̄||² (Kong et al., 2021, "Consensus Control for Decentralized Deep
Learning") is a figure of every epoch; the final model is the replicas' mean (one all-reduce), with each replica's
own test accuracy beside it, as model averaging reports.
"""

import math
import os
from typing import Any, ClassVar

import pytorch_lightning as L
import torch
from torch import Tensor
from typing_extensions import override

from psgd.choices import TIME_VARYING, torus_shape
from psgd.io import say
from psgd.process import QUIET_ENV
from psgd.strategies.collective import out_degrees
from psgd.strategies.compression import qsgd_bytes, qsgd_quantise, scaled_sign, seeded, sign_bytes
from psgd.strategies.model_averaging import ModelAveragingStrategy

CHOCO_KEY = "psgd_choco"  # a checkpoint's CHOCO state of each worker: x̂_i and s_i


# ---- the graphs ----


def _edges(topology: str, n: int, step: int, seed: int) -> set[tuple[int, int]]:
    """The undirected graphs' edges (i < j)."""
    if topology == "ring":
        pairs = [(i, (i + 1) % n) for i in range(n)]
    elif topology == "torus":
        rows, cols = torus_shape(n) or (1, n)
        pairs = [(r * cols + c, ((r + 1) % rows) * cols + c) for r in range(rows) for c in range(cols)]
        pairs += [(r * cols + c, r * cols + (c + 1) % cols) for r in range(rows) for c in range(cols)]
    elif topology == "complete":
        pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    else:  # random_matching: drawn per round from (seed, round), the same on every worker
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + step)).tolist()
        pairs = list(zip(order[0::2], order[1::2], strict=False))
    return {(min(i, j), max(i, j)) for i, j in pairs if i != j}


def mixing_matrix(topology: str, workers: int, weights: str = "uniform", step: int = 0, seed: int = 0) -> Tensor:
    """W (float64, workers x workers) of gossip round `step`: x_i <- sum_j W[i, j] x_j.

    Args:
        topology: ring, torus, complete, random_matching (undirected, W symmetric), exponential or
            one_peer_exponential (directed).
        weights: the undirected graphs' edge weights: uniform (1 / (the largest degree + 1)) or
            metropolis_hastings (1 / (1 + max(d_i, d_j))); the diagonal takes the rest of each row.
        step: the round (from 0): the time-varying graphs' round.
        seed: random_matching's draws.
    """
    n, w = workers, torch.zeros(workers, workers, dtype=torch.float64)
    if topology in ("exponential", "one_peer_exponential"):
        hops = max(1, math.ceil(math.log2(n))) if n > 1 else 0
        offsets = {2**k % n for k in range(hops)} - {0}
        if topology == "one_peer_exponential" and offsets:
            offsets = {2 ** (step % hops) % n} - {0}
        for i in range(n):
            for o in offsets:
                w[i, (i + o) % n] = 1 / (len(offsets) + 1)
    else:
        edges = _edges(topology, n, step, seed)
        degree = [sum(i in e for e in edges) for i in range(n)]
        for i, j in edges:
            mh = weights == "metropolis_hastings"
            w[i, j] = w[j, i] = 1 / (1 + (max(degree[i], degree[j]) if mh else max(degree)))
    return w + torch.diag(1 - w.sum(dim=1))


def mixing_rate(topology: str, workers: int, weights: str = "uniform", seed: int = 0) -> float:
    """ρ, the consensus distance's contraction per round (its square): ||W - J||_2 with J = 11^T / P; one-peer
    exponential graphs: that of a cycle of its rounds, per round; random matchings: the root of the largest
    eigenvalue of E[(W - J)^T (W - J)], over 256 of the seed's rounds."""
    j = torch.full((workers, workers), 1 / workers, dtype=torch.float64)
    if topology == "one_peer_exponential":
        hops = max(1, math.ceil(math.log2(workers)))
        product = torch.eye(workers, dtype=torch.float64)
        for step in range(hops):
            product = mixing_matrix(topology, workers, weights, step) @ product
        return float(torch.linalg.matrix_norm(product - j, ord=2)) ** (1 / hops)
    if topology == "random_matching":
        rounds = [mixing_matrix(topology, workers, weights, step, seed) - j for step in range(256)]
        expected = sum(d.T @ d for d in rounds) / len(rounds)
        return float(torch.linalg.eigvalsh(expected).max().clamp_min(0).sqrt())
    return float(torch.linalg.matrix_norm(mixing_matrix(topology, workers, weights) - j, ord=2))


# ---- CHOCO's compression operators: each returns C(v) as a dense tensor, and its payload in bytes ----


def compress(
    method: str, v: Tensor, sizes: list[int], ratio: float, levels: int, seed: list[int]
) -> tuple[Tensor, int]:
    """C(v) of a flat vector of parameters of `sizes`: top-k of the whole vector (values and int32 indices sent),
    the scaled sign per parameter (|p|_1 / n) sign(p) (a bit per entry and a float), or QSGD per parameter
    (psgd.strategies.compression's quantiser, drawn from `seed` + [parameter])."""
    if method == "topk":
        top = v.abs().topk(math.ceil(ratio * v.numel()), sorted=False).indices
        return torch.zeros_like(v).index_put_((top,), v[top]), top.numel() * 8
    parts = v.split(sizes)
    if method == "sign":
        return torch.cat([scaled_sign(p) for p in parts]), sum(sign_bytes(p.numel()) for p in parts)
    generator = torch.Generator(device=v.device)
    out = [qsgd_quantise(p, levels, seeded(generator, *seed, i)) for i, p in enumerate(parts)]
    return torch.cat(out), sum(qsgd_bytes(p.numel(), levels) for p in parts)


def choco_round(x: Tensor, public: Tensor, public_mix: Tensor, w: Tensor, comm, gamma: float, compressor) -> list[int]:
    """One CHOCO-SGD gossip round of the workers held by `comm` (x, x̂, s: rows [R, n]), in place: q_i = C(x_i - x̂_i)
    sent to i's neighbours, x̂_i += q_i, s_i += sum_j W[i, j] q_j, x_i += γ (s_i - x̂_i). `compressor(v)` returns the
    rows' C(v) and each one's payload in bytes; returns each worker's bytes sent."""
    q, sizes = compressor(x - public)
    mixed, sent = comm.mix(q, w, sizes)
    public_mix.add_(mixed)
    public.add_(q)
    x.add_(public_mix - public, alpha=gamma)
    return sent


class DecentralizedStrategy(ModelAveragingStrategy):
    """D-PSGD (CHOCO-SGD with a compression): each replica mixes with its neighbours on `topology` every
    `gossip_every` steps; the replicas' mean is the final model."""

    figures: ClassVar[dict[str, tuple[str, int]]] = {
        **ModelAveragingStrategy.figures,  # the time in gossip rounds is `averaging_s`
        "consensus_distance": ("decentralized/consensus_distance", 8),
    }
    strategy_name = "decentralized"
    per_worker_keys = (*ModelAveragingStrategy.per_worker_keys, CHOCO_KEY)

    def __init__(
        self,
        topology: str = "ring",
        weights: str = "uniform",
        gossip_every: int = 1,
        order: str = "mix_then_step",
        compression: str = "none",
        consensus_lr: float = 1.0,
        topk_ratio: float = 0.01,
        qsgd_levels: int = 16,
        log_consensus_every: int | None = None,
        **kwargs: Any,
    ):
        super().__init__(period=None, **kwargs)
        self.topology, self.weights, self.gossip_every, self.order = topology, weights, gossip_every, order
        self.compression, self.consensus_lr = compression, consensus_lr
        self.topk_ratio, self.qsgd_levels = topk_ratio, qsgd_levels
        self.log_consensus_every = log_consensus_every  # optimizer steps between consensus figures in TensorBoard
        self.rho = 0.0  # set in setup, where the workers are known
        self.public: Tensor | None = None  # CHOCO: x̂_i
        self.public_mix: Tensor | None = None  # CHOCO: s_i = sum_j W_ij x̂_j
        self._static_w: Tensor | None = None  # a graph that does not change: its W, made once

    @override
    def setup(self, trainer: L.Trainer) -> None:
        super().setup(trainer)
        self.rho = mixing_rate(self.topology, self.workers, self.weights, self.seed)
        if self.compression != "none":  # rows [R, n]: each worker's own
            flat = self.comm.flat(self.replica_params())
            self.public, self.public_mix = torch.zeros_like(flat), torch.zeros_like(flat)
        if self.is_global_zero and os.environ.get(QUIET_ENV) != "1":  # (quiet=true: workers inherit it)
            say(
                f"psgd: decentralized SGD on a {self.topology} of {self.workers} workers: mixing rate "
                f"rho={self.rho:.4f}, spectral gap {1 - self.rho:.4f}"
            )

    @override
    def settings(self) -> dict[str, Any]:
        return {
            "topology": self.topology,
            "weights": self.weights,
            "gossip_every": self.gossip_every,
            "order": self.order,
            "compression": self.compression,
            "consensus_lr": self.consensus_lr,
            "spectral_gap": round(1 - self.rho, 6),
        }

    @override
    def averages_at(self, done: int) -> bool:
        return done % self.gossip_every == 0

    @override
    def averagings(self, done: int) -> int:
        """The gossip rounds of the first `done` common steps."""
        return done // self.gossip_every

    @override
    def optimizer_step(self, optimizer, closure, model=None, **kwargs: Any) -> Any:
        """D-PSGD's order: the gradient at the unmixed replica, then the mix, then the step from the mixed one;
        the step-then-mix order and CHOCO: model averaging's (the step, then the round)."""
        if self.order == "step_then_mix" or self.compression != "none":
            output = super().optimizer_step(optimizer, closure, model, **kwargs)
        else:
            self._steps_in_epoch += 1
            gossips = self._averages_now()

            def gradient_then_mix() -> Any:
                loss = closure()  # Lightning's forward and backward, at x_i
                if gossips:
                    self._timed_sync()
                return loss

            output = super(ModelAveragingStrategy, self).optimizer_step(optimizer, gradient_then_mix, model, **kwargs)
        every = self.log_consensus_every
        if every and self._steps_in_epoch <= self._common_steps and self._common_done() % every == 0:
            self._log_consensus()
        return output

    def _log_consensus(self) -> None:
        """The consensus distance now, to TensorBoard at this step (one all-reduce of the weights, every worker)."""
        (squared,) = self.comm.total([[d**2] for d in self._distance_from_mean()])
        trainer = self.lightning_module.trainer
        if trainer.is_global_zero and trainer.logger is not None:
            consensus = squared / self.workers
            trainer.logger.log_metrics({"decentralized/consensus_distance": consensus}, step=trainer.global_step)

    @override
    def _sync(self) -> None:
        """One gossip round (round r = the rounds before it: the time-varying graphs' W)."""
        r = self.averagings(self._common_done()) - 1
        w = self._mixing_matrix(r)
        params = self.replica_params()
        x = self.comm.flat(params)
        if self.compression == "none":
            mixed, sent = self.comm.mix(x, w)
        else:
            sizes = [self.comm.rows(p).shape[1] for p in params]

            def compressor(v: Tensor) -> tuple[Tensor, list[int]]:
                seeds = ([self.seed, rank, r] for rank in self.comm.ranks)
                out = [compress(self.compression, row, sizes, self.topk_ratio, self.qsgd_levels, seed)
                       for row, seed in zip(v, seeds, strict=True)]  # fmt: skip
                return torch.stack([c for c, _ in out]), [size for _, size in out]

            mixed = x
            sent = choco_round(x, self.public, self.public_mix, w, self.comm, self.consensus_lr, compressor)
        self.comm.unflat_(params, mixed)
        degrees = out_degrees(w)
        self._count(sent, [degrees[rank] for rank in self.comm.ranks])

    def _mixing_matrix(self, r: int) -> Tensor:
        """W of gossip round `r`: a time-varying graph's round, a static graph's made once (mixing_matrix's loops
        over the workers are a step's work at hundreds of simulated workers)."""
        if self.topology in TIME_VARYING:
            return mixing_matrix(self.topology, self.workers, self.weights, r, self.seed)
        if self._static_w is None:
            self._static_w = mixing_matrix(self.topology, self.workers, self.weights)
        return self._static_w

    @override
    def epoch_figures(self) -> dict[str, float]:
        """This epoch's end: the consensus distance (1/P) sum_i ||x_i - x̄||², the replicas' mean distance from
        their mean and the mean time in gossip rounds over the workers (s; it starts anew)."""
        spent, self._averaging_s = self._averaging_s, 0.0
        rows = [[spent, d**2, d] for d in self._distance_from_mean()]
        total, squared, summed = self.comm.total(rows)
        p = self.workers
        return {"consensus_distance": squared / p, "replica_distance": summed / p, "averaging_s": total / p}

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None) -> None:
        """CHOCO's x̂_i and s_i too (each worker's own, kept per worker)."""
        if self.public is not None:
            checkpoint = {**checkpoint, CHOCO_KEY: [self.public.cpu().clone(), self.public_mix.cpu().clone()]}
        super().save_checkpoint(checkpoint, filepath, storage_options)

    @override
    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        if self.public is not None and CHOCO_KEY in checkpoint:
            self.public.copy_(checkpoint[CHOCO_KEY][0])
            self.public_mix.copy_(checkpoint[CHOCO_KEY][1])
        return checkpoint

    @classmethod
    @override
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register(
            cls.strategy_name, cls, description="decentralized SGD on a graph (D-PSGD)", start_method="spawn"
        )
