"""The communication a strategy's algorithm is written against, with two implementations: `Distributed`, one
worker per process (torch.distributed), and `Stacked`, every worker a replica in this process (simulate=true).

A strategy holds its workers' state as *replica tensors*: where a process is one worker, a tensor of that worker
(a parameter, its momentum, EASGD's centre); where it holds P simulated workers, the same tensor stacked over a
leading replica dimension, [P, ...]. The algorithm applies elementwise arithmetic to them alike and exchanges them
only through these methods, so that one algorithm runs in both (psgd.strategies.simulated). Rows ([R, ...], R the
workers this process holds, `ranks`) are the form for what differs per worker: flattened replicas, per-worker
figures.

`Stacked` also keeps each replica's simulated clock (psgd.strategies.network.Clocks): each exchange of the
algorithm (`counted`) makes the workers it joins wait for each other and adds its time on the network model.
"""

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.futures import Future

from psgd.strategies.network import Clocks, Network
from psgd.strategies.workers import gather_floats, over_workers


def _initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def average_tensors(tensors: list[Tensor], group: dist.ProcessGroup | None = None) -> int:
    """All-reduce-average `tensors` in place across `group` (None: all workers), in one flat buffer; returns the
    bytes this worker handed to the all-reduce (0 for no tensor or one worker: no collective).

    Keeps each tensor's memory format (torch's `average_parameters` rebinds `.data` and drops
    channels_last). Integer tensors must not be passed.
    """
    if not tensors or not _initialized() or dist.get_world_size(group) == 1:  # the average is its own
        return 0
    flat = torch.cat(
        [t.detach().reshape(-1).to(torch.float64 if t.dtype == torch.float64 else torch.float32) for t in tensors]
    )
    dist.all_reduce(flat, group=group)
    flat /= dist.get_world_size(group)
    offset = 0
    for t in tensors:
        t.detach().copy_(flat[offset : offset + t.numel()].view(t.shape))
        offset += t.numel()
    return flat.numel() * flat.element_size()


def future_for(tensor: Tensor) -> Future:
    """A future to complete by hand, for results on `tensor`'s device (a CUDA result needs its device named)."""
    return Future(devices=[tensor.device]) if tensor.is_cuda else Future()


def completed(value: Any, like: Tensor) -> Future:
    """A future already done, of `value` (tensors on `like`'s device)."""
    future = future_for(like)
    future.set_result(value)
    return future


def payload(tensors: list[Tensor]) -> int:
    """The bytes of one worker's rows of the replica tensors `tensors` as average_tensors' buffer carries them:
    fp32, fp64 where any is."""
    size = 8 if any(t.dtype == torch.float64 for t in tensors) else 4
    return sum(t[0].numel() for t in tensors) * size


def neighbours(w: Tensor, rank: int) -> tuple[list[int], list[int]]:
    """Whom worker `rank` sends to (the k with W[k, rank] > 0) and receives from (the j with W[rank, j] > 0)."""
    others = [j for j in range(len(w)) if j != rank]
    return [k for k in others if w[k, rank] > 0], [j for j in others if w[rank, j] > 0]


def out_degrees(w: Tensor) -> list[int]:
    """Each worker's count of out-neighbours (`neighbours`' first list), for every worker at once."""
    linked = w > 0
    return (linked.sum(0) - linked.diagonal().int()).tolist()


def exchange(flat: Tensor, send_to: list[int], receive_from: list[int]) -> dict[int, Tensor]:
    """Send `flat` to each of `send_to` and receive a tensor like it from each of `receive_from`, all at once
    (torch.distributed's batched point-to-point operations); returns the received by sender."""
    received = {peer: torch.empty_like(flat) for peer in receive_from}
    ops = [dist.P2POp(dist.isend, flat, peer) for peer in send_to]
    ops += [dist.P2POp(dist.irecv, buffer, peer) for peer, buffer in received.items()]
    for request in dist.batch_isend_irecv(ops) if ops else []:
        request.wait()
    return received


class Distributed:
    """This process is worker `rank` of `size`: tensors are its own; exchanges are torch.distributed's (figures go
    through `device`: NCCL carries only its GPU's tensors)."""

    def __init__(self, device: torch.device | Callable[[], torch.device] | None = None) -> None:
        self._device = device or torch.device("cpu")  # or how to find it, once the workers have theirs
        self._groups: dict[int, dist.ProcessGroup | None] = {}  # group size -> this worker's group of that size

    @property
    def device(self) -> torch.device:
        return self._device() if callable(self._device) else self._device

    @property
    def size(self) -> int:
        return dist.get_world_size() if _initialized() else 1

    @property
    def ranks(self) -> list[int]:
        return [dist.get_rank() if _initialized() else 0]

    def prepare_groups(self, sizes: list[int]) -> None:
        """Make the groups of consecutive ranks of each size (every worker calls it, in the same order)."""
        for size in sizes:  # under torchrun / srun a node's processes are consecutive ranks
            self._groups[size] = None if size == self.size else dist.new_subgroups(group_size=size)[0]

    def rows(self, tensor: Tensor) -> Tensor:
        """A replica tensor as rows: [R, numel]."""
        return tensor.reshape(1, -1)

    def flat(self, tensors: list[Tensor], dtype: torch.dtype | None = None) -> Tensor:
        """The replica tensors flattened and joined: [R, sum of numel], a copy."""
        return torch.cat([self.rows(t.detach()).to(dtype or t.dtype) for t in tensors], dim=1)

    def unflat_(self, tensors: list[Tensor], flat: Tensor) -> None:
        """Copy rows made by `flat` back into the replica tensors."""
        with torch.no_grad():
            for t, part in zip(tensors, flat.split([self.rows(t).shape[1] for t in tensors], dim=1), strict=True):
                t.copy_(part.view_as(t))

    def mean_(self, tensors: list[Tensor], group_size: int | None = None, counted: bool = True) -> int:
        """Average the replica tensors in place over each group of `group_size` consecutive ranks (None: all
        workers); returns the bytes each worker sent. `counted`: an exchange of the algorithm (False: a figure's)."""
        return average_tensors(tensors, self._groups.get(group_size) if group_size else None)

    def sum_async(self, rows: Tensor, payload: int | None = None) -> Future:
        """Every worker's `rows` ([R, n]) summed over the workers: a future of the sum, [n]. `payload`: a worker's
        bytes as the method's encoding counts them (what simulated time charges; None: the rows as they are)."""
        (row,) = rows
        return dist.all_reduce(row, async_op=True).get_future().then(lambda fut: fut.value()[0])

    def gather_async(self, rows: list[Tensor], payload: int | None = None) -> Future:
        """Every worker's rows of each of `rows` ([R, k] each), in rank order: a future of them, [P, k] each, one
        all-gather each (`payload`: sum_async's)."""
        every = [[torch.empty_like(r[0]) for _ in range(self.size)] for r in rows]
        futures = [dist.all_gather(out, r[0], async_op=True).get_future() for out, r in zip(every, rows, strict=True)]

        def stacked(done: Future) -> list[Tensor]:
            for fut in done.value():
                fut.wait()  # NCCL: the stream waits for the all-gather (its future completes when queued)
            return [torch.stack(out) for out in every]

        return torch.futures.collect_all(futures).then(stacked)

    def broadcast_(self, tensors: list[Tensor]) -> None:
        """Every worker's replica tensors become worker 0's."""
        if _initialized():
            for t in tensors:
                dist.broadcast(t.data, src=0)

    def mix(self, x: Tensor, w: Tensor, payloads: list[int] | None = None) -> tuple[Tensor, list[int]]:
        """One gossip round: row i becomes sum_j W[i, j] x_j (x: [R, n] rows), this worker's by point-to-point
        exchanges with its neighbours; returns the mixed rows and each row's bytes sent: its out-neighbours x
        its payload (`payloads`' bytes a message as its encoding counts them; None: the rows as they are)."""
        (rank,) = self.ranks
        send_to, receive_from = neighbours(w, rank)
        mixed = x[0] * w[rank, rank].item()
        for j, x_j in exchange(x[0].contiguous(), send_to, receive_from).items():
            mixed.add_(x_j, alpha=w[rank, j].item())
        (size,) = payloads or [x[0].numel() * x.element_size()]
        return mixed.unsqueeze(0), [len(send_to) * size]

    def total(self, rows: list[list[float]]) -> list[float]:
        """The per-worker `rows` (a row per worker held here) summed over every worker."""
        (row,) = rows
        return over_workers(row, self.device)

    def gather(self, rows: list[list[float]]) -> list[list[float]]:
        """Every worker's row, in rank order."""
        (row,) = rows
        return gather_floats(row, self.device)

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every worker's `obj`, in rank order."""
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj)
        return out


class Stacked:
    """P simulated workers in this process: a replica tensor is [P, ...]; an exchange is a tensor operation over
    the replica dimension, timed on `network` by each replica's clock (`clocks`); `busy_s`, this machine's time in
    the algorithm's exchanges (not the workers' compute)."""

    def __init__(self, size: int, network: Network | None = None) -> None:
        self.size, self.ranks = size, list(range(size))
        self.clocks = Clocks(size, network or Network())
        self.busy_s = 0.0

    def prepare_groups(self, sizes: list[int]) -> None:
        pass  # a group of g consecutive ranks is a block of g rows

    def rows(self, tensor: Tensor) -> Tensor:
        return tensor.reshape(self.size, -1)

    flat = Distributed.flat
    unflat_ = Distributed.unflat_

    def mean_(self, tensors: list[Tensor], group_size: int | None = None, counted: bool = True) -> int:
        g = group_size or self.size
        if not tensors or g == 1:
            return 0
        start = time.perf_counter()
        with torch.no_grad():
            for t in tensors:
                blocks = t.view(self.size // g, g, *t.shape[1:])
                blocks.copy_(blocks.mean(1, keepdim=True, dtype=torch.float64).to(t.dtype).expand_as(blocks))
        sent = payload(tensors)
        if counted:
            self.clocks.all_reduce(sent, g)
            self.busy_s += time.perf_counter() - start
        return sent

    def sum_async(self, rows: Tensor, payload: int | None = None) -> Future:
        start = time.perf_counter()
        total = rows.sum(0)
        self.clocks.all_reduce(rows.shape[1] * rows.element_size() if payload is None else payload, self.size)
        self.busy_s += time.perf_counter() - start
        return completed(total, rows)

    def gather_async(self, rows: list[Tensor], payload: int | None = None) -> Future:
        sent = sum(r.shape[1] * r.element_size() for r in rows) if payload is None else payload
        self.clocks.all_gather(sent)
        return completed(list(rows), rows[0])

    def broadcast_(self, tensors: list[Tensor]) -> None:
        with torch.no_grad():
            for t in tensors:
                t[1:] = t[:1]

    def mix(self, x: Tensor, w: Tensor, payloads: list[int] | None = None) -> tuple[Tensor, list[int]]:
        start = time.perf_counter()
        mixed = w.to(x.dtype) @ x
        payloads = payloads or [x.shape[1] * x.element_size()] * self.size
        sent = [d * size for d, size in zip(out_degrees(w), payloads, strict=True)]
        self.clocks.exchange(w, sent)
        self.busy_s += time.perf_counter() - start
        return mixed, sent

    def total(self, rows: list[list[float]]) -> list[float]:
        return torch.tensor(rows, dtype=torch.float64).sum(0).tolist()

    def gather(self, rows: list[list[float]]) -> list[list[float]]:
        return [list(map(float, row)) for row in rows]

    def gather_objects(self, obj: Any) -> list[Any]:
        return [obj]
