"""Decentralized SGD's graphs and gossip (psgd.strategies.decentralized): the mixing matrices, their mixing rate
against closed forms, and gossip rounds through real point-to-point exchanges between 4 gloo processes, which
simulated workers' tensor operations (psgd.strategies.collective.Stacked) repeat."""

import math
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import compose_cfg

from psgd.choices import TIME_VARYING, torus_shape
from psgd.config import ConfigError, check_values
from psgd.strategies.collective import Distributed, Stacked
from psgd.strategies.decentralized import choco_round, compress, mixing_matrix, mixing_rate

UNDIRECTED = ("ring", "torus", "complete", "random_matching")
DIRECTED = ("exponential", "one_peer_exponential")


def graphs(workers: int):
    """Every (topology, weights) a run of `workers` may take (a torus only where it has rows and columns)."""
    for topology in UNDIRECTED + DIRECTED:
        if topology == "torus" and torus_shape(workers) is None:
            continue
        for weights in ("uniform", "metropolis_hastings") if topology in UNDIRECTED else ("uniform",):
            yield topology, weights


@pytest.mark.parametrize("workers", range(2, 17))
def test_every_mixing_matrix_is_doubly_stochastic_and_symmetric_where_the_graph_is_undirected(workers):
    for topology, weights in graphs(workers):
        for step in range(5):  # the time-varying graphs' rounds
            w = mixing_matrix(topology, workers, weights, step, seed=3)
            ones = torch.ones(workers, dtype=torch.float64)
            assert (w >= 0).all(), (topology, weights, step)
            assert torch.allclose(w.sum(0), ones) and torch.allclose(w.sum(1), ones), (topology, weights, step)
            if topology in UNDIRECTED:
                assert torch.equal(w, w.T), (topology, weights, step)


@pytest.mark.parametrize("workers", range(4, 17))
def test_the_mixing_rate_matches_the_closed_forms(workers):
    # ring with weights 1/3: the eigenvalues (1 + 2 cos(2 pi k / P)) / 3, the largest in magnitude at k = 1
    assert mixing_rate("ring", workers) == pytest.approx((1 + 2 * math.cos(2 * math.pi / workers)) / 3, abs=1e-9)
    assert mixing_rate("complete", workers) == pytest.approx(0, abs=1e-9)
    assert mixing_rate("ring", workers) > mixing_rate("exponential", workers)  # the exponential graph mixes faster
    if workers & (workers - 1) == 0:  # one-peer exponential, P a power of 2: a cycle of rounds averages exactly
        assert mixing_rate("one_peer_exponential", workers) == pytest.approx(0, abs=1e-6)


def test_a_torus_is_rows_by_columns_and_a_prime_count_has_none():
    assert [torus_shape(p) for p in (4, 6, 8, 9, 12, 16)] == [(2, 2), (2, 3), (2, 4), (3, 3), (3, 4), (4, 4)]
    assert [torus_shape(p) for p in (1, 2, 3, 5, 7, 13)] == [None] * 6
    w = mixing_matrix("torus", 9)
    assert ((w > 0).sum(1) == 5).all()  # 4 neighbours and itself: weights 1/5


def test_choco_compressions_send_what_they_count():
    v, sizes = torch.randn(1000, generator=torch.Generator().manual_seed(0)), [600, 400]
    top, size = compress("topk", v, sizes, ratio=0.01, levels=16, seed=[0, 0, 0])
    assert (top != 0).sum() == 10 and size == 10 * 8 and torch.equal(top[top != 0], v[top != 0])
    signs, size = compress("sign", v, sizes, ratio=0.01, levels=16, seed=[0, 0, 0])
    assert torch.allclose(signs[:600].abs(), v[:600].abs().mean().expand(600)) and size == 75 + 4 + 50 + 4
    q, size = compress("qsgd", v, sizes, ratio=0.01, levels=16, seed=[0, 0, 0])
    assert q.shape == v.shape and size == math.ceil(1000 * 6 / 8) + 4 * (
        2 + 1
    )  # 6 bits an entry (33 symbols), 3 chunks


def identity(v: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    return v.clone(), [v.shape[1] * v.element_size()] * len(v)


def gossip_rounds(comm, x: torch.Tensor) -> dict:
    """Each graph's rounds of pure gossip (no gradient step) from the rows `x` of the workers `comm` holds, and
    CHOCO's with C the identity."""
    results = {}
    for topology, weights in graphs(4):
        rows, rounds = x.clone(), []
        for step in range(6):
            rows, _ = comm.mix(rows, mixing_matrix(topology, 4, weights, step, seed=3))
            rounds.append(rows.clone())
        results[topology, weights] = rounds
    for topology, gamma in (("ring", 1.0), ("exponential", 1.0), ("ring", 0.5)):
        rows = x.clone()
        public, public_mix, rounds = torch.zeros_like(rows), torch.zeros_like(rows), []
        for _ in range(6):
            choco_round(rows, public, public_mix, mixing_matrix(topology, 4), comm, gamma, identity)
            rounds.append(rows.clone())
        results["choco", topology, gamma] = rounds
    return results


def gossip_worker(rank: int, port: int, out: str) -> None:
    """gossip_rounds through real point-to-point exchanges, worker `rank` of 4 processes."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=4)
    torch.set_num_threads(1)
    try:
        x = torch.randn(4, 257, generator=torch.Generator().manual_seed(7))[rank : rank + 1]  # drawn alike
        torch.save(gossip_rounds(Distributed(), x), f"{out}/{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def gossiped(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("gossip")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # the fork server imports this module once for the 4 workers: ~4 s less than spawning each
    mp.start_processes(gossip_worker, args=(port, str(out)), nprocs=4, start_method="forkserver")
    per_rank = [torch.load(out / f"{r}.pt", weights_only=False) for r in range(4)]
    return {graph: [torch.cat([r[graph][t] for r in per_rank]) for t in range(6)] for graph in per_rank[0]}


def test_simulated_workers_gossip_as_the_processes_do(gossiped):
    """The same rounds as tensor operations over the replica dimension (simulate=true) give the processes' rows."""
    simulated = gossip_rounds(Stacked(4), torch.randn(4, 257, generator=torch.Generator().manual_seed(7)))
    for graph, rounds in gossiped.items():
        for got, want in zip(simulated[graph], rounds, strict=True):
            assert (got - want).abs().max().item() <= 1e-6, graph


def consensus(x: torch.Tensor) -> float:
    """(1/P) sum_i ||x_i - x̄||²."""
    return ((x - x.mean(0)) ** 2).sum(1).mean().item()


def test_gossip_rounds_exchanged_between_processes_are_w_times_x_and_contract_at_the_mixing_rate(gossiped):
    start = torch.randn(4, 257, generator=torch.Generator().manual_seed(7)).double()
    for graph, rounds in gossiped.items():
        if graph[0] == "choco":
            continue
        topology, weights = graph
        x = start.clone()
        for step, got in enumerate(rounds):
            x = mixing_matrix(topology, 4, weights, step, seed=3) @ x
            assert torch.allclose(got.double(), x, atol=1e-5), (topology, weights, step)
            assert torch.allclose(got.double().mean(0), start.mean(0), atol=1e-6)  # the mean is kept
            if topology not in TIME_VARYING:
                rho = mixing_rate(topology, 4, weights)
                bound = rho ** (2 * (step + 1)) * consensus(start)  # equality where every mode contracts by rho
                assert consensus(got.double()) <= bound * (1 + 1e-5) + 1e-9, (topology, step)
    # one-peer exponential with 4 workers: the exact mean after log2(4) = 2 rounds
    exact = gossiped["one_peer_exponential", "uniform"][1].double()
    assert (exact - start.mean(0)).abs().max().item() <= 1e-6


def test_choco_gossip_without_compression_and_a_consensus_step_of_1_is_exact_gossip(gossiped):
    """x̂ = 0 at the start (the paper's), C the identity, γ = 1: each round is D-PSGD's x <- W x; a smaller γ
    moves only part of the way, and still keeps the mean."""
    start = torch.randn(4, 257, generator=torch.Generator().manual_seed(7))
    for topology in ("ring", "exponential"):
        for exact, choco in zip(gossiped[topology, "uniform"], gossiped["choco", topology, 1.0], strict=True):
            assert (exact - choco).abs().max().item() <= 1e-6, topology
    slower = gossiped["choco", "ring", 0.5]
    assert consensus(slower[0]) > consensus(gossiped["ring", "uniform"][0])
    assert all(torch.allclose(x.mean(0), start.mean(0), atol=1e-5) for x in slower)


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (["strategy.topology=star"], "strategy.topology='star' is invalid: Input should be 'ring', 'torus'"),
        (
            ["workers=5", "strategy.topology=torus"],
            "strategy.topology=torus is invalid with 5 workers: a 2-D torus needs rows x columns, each at least 2",
        ),
        (["strategy.gossip_every=0"], "strategy.gossip_every=0 is invalid: Input should be greater than or equal to 1"),
        (
            ["strategy.consensus_lr=1.5"],
            "strategy.consensus_lr=1.5 is invalid: Input should be less than or equal to 1",
        ),
        (["strategy.consensus_lr=0"], "strategy.consensus_lr=0 is invalid: Input should be greater than 0"),
        (["+strategy.lock=true"], "strategy.lock=True is invalid with strategy=decentralized: it is a key of"),
        (["strategy.compression=powersgd"], "strategy.compression='powersgd' is invalid: Input should be 'none'"),
        (
            ["strategy.compression=topk", "strategy.topology=random_matching"],
            "strategy.compression=topk is invalid with strategy.topology=random_matching: CHOCO keeps",
        ),
    ],
)
def test_bad_decentralized_settings_are_one_line(overrides, said):
    with pytest.raises(ConfigError) as e:
        check_values(compose_cfg("strategy=decentralized", "workers=4", *overrides))
    assert str(e.value).startswith(said) and "\n" not in str(e.value)
