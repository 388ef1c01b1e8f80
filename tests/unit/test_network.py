"""The network model of simulated workers (psgd.strategies.network): the α-β costs on hand-computed cases, and the
simulated workers' clocks: who waits for whom under each strategy's exchanges, stragglers among them."""

import pytest
import torch

from psgd.strategies.collective import Stacked
from psgd.strategies.decentralized import mixing_matrix
from psgd.strategies.network import Clocks, Network, all_gather_s, all_reduce_s, gossip_s

# 1 Gb/s = 125e6 bytes/s, 1 ms latency
GIGABIT = Network(bandwidth_gbps=1.0, latency_ms=1.0)


def test_the_alpha_beta_costs_of_each_exchange():
    # ring all-reduce of 1 MB over 4 workers: 2(P-1) α + 2(P-1)/P n/B = 6 ms + 1.5 * 8 ms
    assert all_reduce_s(1e6, 4, GIGABIT) == pytest.approx(0.006 + 0.012)
    # a gossip round sending 1 MB to each of 2 neighbours: α + d n/B = 1 ms + 16 ms
    assert gossip_s(1e6, 2, GIGABIT) == pytest.approx(0.017)
    # ring all-gather of 10 kB from each of 4 workers (compressed DDP's top-k): (P-1)(α + n/B) = 3 x (1 ms + 0.08 ms)
    assert all_gather_s(1e4, 4, GIGABIT) == pytest.approx(3 * 0.00108)
    # one worker, or no neighbour, sends nothing
    assert all_reduce_s(1e6, 1, GIGABIT) == gossip_s(1e6, 0, GIGABIT) == all_gather_s(1e6, 1, GIGABIT) == 0
    # 100 Gb/s: the bandwidth term 100x smaller, the latency's the same
    fast = Network(bandwidth_gbps=100.0, latency_ms=1.0)
    assert all_reduce_s(1e6, 4, fast) == pytest.approx(0.006 + 0.012 / 100)


def test_compute_scale_speeds_every_worker_and_a_straggler_factor_slows_one():
    clocks = Clocks(4, Network(compute_scale=2.0))
    clocks.compute(0.1, factors=torch.tensor([1.0, 1.0, 1.0, 3.0], dtype=torch.float64))
    assert clocks.now.tolist() == pytest.approx([0.05, 0.05, 0.05, 0.15])
    clocks.compute(0.1, delays=torch.tensor([0.0, 0.01, 0.0, 0.0], dtype=torch.float64))
    assert clocks.now.tolist() == pytest.approx([0.1, 0.11, 0.1, 0.2])


SLOW = torch.tensor([1.0, 1.0, 1.0, 4.0], dtype=torch.float64)  # the last of 4 workers 4x slower


def synchronous(steps: int, compute: float) -> Clocks:
    """DDP: every step, compute, then an all-reduce (of nothing: only its latency)."""
    clocks = Clocks(4, GIGABIT)
    for _ in range(steps):
        clocks.compute(compute, SLOW)
        clocks.all_reduce(0, 4)
    return clocks


def test_a_straggler_holds_every_step_of_a_synchronous_strategy_and_local_sgd_only_at_its_averaging_points():
    c, latency = 0.01, all_reduce_s(0, 4, GIGABIT)  # 6 ms: 2(P-1) α
    # synchronous: after each step every worker has waited for the slowest: 3 steps = 3 x (4c + the all-reduce)
    assert synchronous(3, c).now.tolist() == pytest.approx([3 * (4 * c + latency)] * 4)
    # local SGD with period 4, between its points: each worker at its own pace
    local = Clocks(4, GIGABIT)
    for _ in range(3):
        local.compute(c, SLOW)
    assert local.now.tolist() == pytest.approx([3 * c, 3 * c, 3 * c, 12 * c])
    local.compute(c, SLOW)
    local.all_reduce(0, 4)  # the averaging point: every worker waits for the slowest, once
    assert local.now.tolist() == pytest.approx([16 * c + latency] * 4)
    assert synchronous(4, c).elapsed() - local.elapsed() == pytest.approx(3 * latency)


def test_random_delays_cost_a_synchronous_strategy_the_sum_of_maxima_and_local_sgd_the_max_of_sums():
    delays = torch.tensor([[0.0, 0.0, 0.0, 0.3], [0.3, 0.0, 0.0, 0.0], [0.0, 0.3, 0.0, 0.0]], dtype=torch.float64)
    ddp, local = Clocks(4, GIGABIT), Clocks(4, GIGABIT)
    for step in delays:
        ddp.compute(0.1, delays=step)
        ddp.all_reduce(0, 4)
        local.compute(0.1, delays=step)
    local.all_reduce(0, 4)
    assert ddp.elapsed() == pytest.approx(3 * (0.4 + 0.006))  # a 0.3 s delay somewhere in every step
    assert local.elapsed() == pytest.approx(0.3 + 0.3 + 0.006)  # each worker delayed once, apart


def test_hierarchical_groups_wait_only_within_themselves():
    clocks = Clocks(4, GIGABIT)
    clocks.compute(0.1, SLOW)
    clocks.all_reduce(1e6, 2)  # groups {0, 1} and {2, 3}
    within = all_reduce_s(1e6, 2, GIGABIT)
    assert clocks.now.tolist() == pytest.approx([0.1 + within] * 2 + [0.4 + within] * 2)


def test_a_gossip_round_waits_for_the_neighbours_only_and_a_straggler_spreads_round_by_round():
    """A ring of 4, worker 3 late: its neighbours 0 and 2 wait for it in the first round, worker 1 (across the
    ring) only in the second, through them."""
    net = Network(bandwidth_gbps=1.0, latency_ms=1.0)
    comm = Stacked(4, net)
    comm.clocks.now = torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    w = mixing_matrix("ring", 4)
    x = torch.zeros(4, 250)  # 1 kB a worker
    comm.mix(x, w)
    hop = gossip_s(1000, 2, net)  # two neighbours, 1 kB each
    assert comm.clocks.now.tolist() == pytest.approx([1 + hop, hop, 1 + hop, 1 + hop])
    comm.mix(x, w)
    assert comm.clocks.now.tolist() == pytest.approx([1 + 2 * hop] * 4)


def test_the_simulated_all_reduce_averages_within_groups_and_counts_a_workers_bytes():
    comm = Stacked(4, GIGABIT)
    t = torch.arange(4.0).repeat_interleave(3).view(4, 3)  # worker r's tensor: three r's
    assert comm.mean_([t], group_size=2) == 3 * 4
    assert t[:, 0].tolist() == [0.5, 0.5, 2.5, 2.5]
    assert comm.mean_([t]) == 12 and t[:, 0].tolist() == [1.5] * 4
    assert comm.clocks.elapsed() == pytest.approx(all_reduce_s(12, 2, GIGABIT) + all_reduce_s(12, 4, GIGABIT))
    comm.mean_([t.clone()], counted=False)  # a figure's, not the algorithm's: no time
    assert comm.clocks.elapsed() == pytest.approx(all_reduce_s(12, 2, GIGABIT) + all_reduce_s(12, 4, GIGABIT))


def test_a_compressed_ddp_exchange_is_charged_its_payload_on_its_collective():
    """Stacked's sum (an all-reduce) charges a compressed method's payload, not the fp32 rows carried; its gather
    (an all-gather) every worker's bytes; both wait for the slowest worker first."""
    comm = Stacked(4, GIGABIT)
    comm.clocks.compute(0.01, SLOW)
    rows = torch.ones(4, 1000)  # 4 kB a worker as fp32; sign's payload: 125 bytes and a float
    assert comm.sum_async(rows, payload=129).wait().tolist() == [4.0] * 1000
    assert comm.clocks.now.tolist() == pytest.approx([0.04 + all_reduce_s(129, 4, GIGABIT)] * 4)
    values, indices = torch.ones(4, 10), torch.zeros(4, 10, dtype=torch.int32)
    gathered = comm.gather_async([values, indices]).wait()
    assert [g.shape for g in gathered] == [(4, 10), (4, 10)]
    assert comm.clocks.elapsed() == pytest.approx(0.04 + all_reduce_s(129, 4, GIGABIT) + all_gather_s(80, 4, GIGABIT))
