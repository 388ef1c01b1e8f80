"""Time on a network the user chooses, for simulated workers: the α-β cost of what a strategy sends, and each
simulated worker's clock.

A message of n bytes costs α + n / B (α the latency, B the bandwidth). The collectives, as NCCL's and gloo's
ring algorithms run them over P workers (Thakur, Rabenseifner and Gropp, 2005; Patarasuk and Yuan, 2009):

- all-reduce of n bytes:           2(P-1) α + 2 (P-1)/P · n / B   (a reduce-scatter, then an all-gather)
- all-gather of n bytes a worker:   (P-1) (α + n / B)               (P-1 steps, each passing on n bytes)
- a gossip round, d out-neighbours: α + d · n / B                  (the d messages share the worker's link)

A compressed exchange is charged its method's payload (DDP's sign and QSGD: the bits of their encoding, which
gloo carries as fp32) at the cost of the collective it uses.

Each worker keeps a clock. A step adds its compute: one replica's share of this machine's time for the step
(psgd.strategies.simulated), divided by `compute_scale`, times the worker's straggler factor, plus its delay. An
exchange joins clocks: an all-reduce's workers all wait for the last to arrive and then spend its time; a gossip
round's worker waits for the neighbours it receives from. So a synchronous strategy pays the slowest worker every
step, local SGD only at its averaging points, and decentralized SGD its neighbours' (which, round after round,
spreads a straggler through the graph).
"""

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Network:
    """The simulated machines: link bandwidth (Gb/s), message latency (ms), and the speed of a worker's compute
    relative to one replica's on this machine (2: twice as fast)."""

    bandwidth_gbps: float = 10.0
    latency_ms: float = 0.05
    compute_scale: float = 1.0

    @property
    def alpha(self) -> float:
        """The latency, s."""
        return self.latency_ms / 1e3

    @property
    def bytes_per_s(self) -> float:
        return self.bandwidth_gbps * 1e9 / 8


def all_reduce_s(n: float, workers: int, net: Network) -> float:
    """A ring all-reduce of n bytes over `workers`: 2(P-1)α + 2(P-1)/P · n/B; 0 for one worker."""
    p = workers
    return 0.0 if p <= 1 else 2 * (p - 1) * net.alpha + 2 * (p - 1) / p * n / net.bytes_per_s


def all_gather_s(n: float, workers: int, net: Network) -> float:
    """A ring all-gather of n bytes from each of `workers`: (P-1)(α + n/B); 0 for one worker."""
    return (workers - 1) * (net.alpha + n / net.bytes_per_s)


def gossip_s(n: float, out_degree: int, net: Network) -> float:
    """A worker sending n bytes to each of `out_degree` neighbours at once: α + d · n/B; 0 to none."""
    return 0.0 if out_degree == 0 else net.alpha + out_degree * n / net.bytes_per_s


class Clocks:
    """Each simulated worker's time (s) on `network`, from the start of training."""

    def __init__(self, workers: int, network: Network) -> None:
        self.network = network
        self.now = torch.zeros(workers, dtype=torch.float64)

    def compute(self, seconds: float, factors: Tensor | None = None, delays: Tensor | None = None) -> None:
        """Every worker computes a step that takes `seconds` on this machine: seconds / compute_scale, times its
        straggler factor, plus its delay."""
        step = torch.full_like(self.now, seconds / self.network.compute_scale)
        if factors is not None:
            step *= factors
        if delays is not None:
            step += delays
        self.now += step

    def all_reduce(self, n: float, group_size: int) -> None:
        """An all-reduce of n bytes a worker within each block of `group_size` consecutive workers."""
        blocks = self.now.view(-1, group_size)
        blocks.copy_(blocks.amax(1, keepdim=True).expand_as(blocks) + all_reduce_s(n, group_size, self.network))

    def all_gather(self, n: float) -> None:
        """An all-gather of n bytes from every worker."""
        self.now.fill_(float(self.now.max()) + all_gather_s(n, len(self.now), self.network))

    def exchange(self, w: Tensor, sent: list[int]) -> None:
        """A gossip round on mixing matrix `w`: worker i waits for the j it receives from (W[i, j] > 0), then
        spends its sending time, `sent[i]` bytes over its out-neighbours' messages (gossip_s)."""
        ready = torch.where(w > 0, self.now.unsqueeze(0), torch.tensor(float("-inf"), dtype=torch.float64))
        start = torch.maximum(ready.amax(1), self.now)
        net = self.network
        cost = [net.alpha + n / net.bytes_per_s if n else 0.0 for n in sent]  # = gossip_s(n / d, d)
        self.now = start + torch.tensor(cost, dtype=torch.float64)

    def elapsed(self) -> float:
        """The time until the last worker is done (s)."""
        return float(self.now.max())
