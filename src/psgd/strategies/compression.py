"""Gradient compression for DDP: one compressor per method, each turning every worker's gradients into the
workers' mean gradient as the method approximates it (what DDP's own all-reduce gives, exactly, for `none`), and
counting the payload a worker sends.

A compressor's arithmetic is written once, on *rows* (a gradient as [R, n]: the R workers held here, each its
own row) and against psgd.strategies.collective's asynchronous sum and gather: in a DDP worker process it is
the communication hook of its bucket (`hook`, R = 1, torch.distributed's collectives), for simulated workers the
exchange of all their stacked gradients at once (`exchange`, R = P, tensor operations over the rows).

- ``none``: DDP's own averaging (in a process torch's ``allreduce_hook`` itself).
- ``fp16``, ``bf16``: the gradients cast down, divided by the workers and summed in half precision (torch's
  ``fp16_compress_hook`` / ``bf16_compress_hook``).
- ``powersgd`` (Vogels, Karimireddy and Jaggi, 2019, "PowerSGD: Practical Low-Rank Gradient Compression"):
  each gradient matrix M (a tensor viewed as rows x the rest) with error feedback, M <- M + e, approximated
  at rank r by one power iteration warm-started from the last step's Q: P = M Q, P all-reduced and
  orthogonalised, Q = M^T P, Q all-reduced and averaged, M ~ P Q^T, e <- M - P Q^T. Tensors too small to gain
  (``min_compression_rate``) are all-reduced as they are, without error. A plain all-reduce before
  ``start_step``. The arithmetic of torch's ``powerSGD_hook``, with its collectives issued in the hook in one
  order on every rank (torch's issues them from future callbacks, whose order differs between ranks when a
  model has several buckets: gloo then fails, pytorch#58467). The first Qs are drawn from one seed per bucket,
  as torch's are; simulated workers have no buckets and draw them from one seed for the model.
- ``topk`` (Stich, Cordonnier and Jaggi, 2018, "Sparsified SGD with Memory"): with this worker's error e,
  p = g + e over the whole model; its k = ceil(ratio d) entries largest in magnitude are sent (values and
  indices, all-gathered once a step, when DDP hands over the step's last bucket); e <- p - sent; the mean of the
  workers' sparse vectors is the result.
- ``sign`` (Karimireddy et al., 2019, "Error Feedback Fixes SignSGD"): p = g + e; per parameter
  c = (|p|_1 / n) sign(p); e <- p - c; the all-reduced mean of c. Its payload is 1 bit per entry and one float
  per parameter; gloo carries c as fp32.
- ``qsgd`` (Alistarh et al., 2017, "QSGD"): each chunk of 512 entries v of a parameter's gradient quantised to
  s levels, q_i = |v|_2 sign(v_i) xi_i / s with xi_i = floor(s |v_i| / |v|_2) + Bernoulli(the remainder):
  unbiased, no error feedback; the all-reduced mean of q. Its payload is ceil(log2(2s + 1)) bits per entry
  (xi in 0..s with a sign: 2s + 1 symbols) and a float per chunk; gloo carries q as fp32.

PowerSGD, sign and QSGD work on each parameter's gradient on its own, top-k on the whole model's in the
parameters' order, and each keeps its state per parameter: what is sent does not depend on how DDP groups
parameters into buckets, which it changes after the first step (and a resumed run starts from the first grouping
again). The error of top-k and sign, PowerSGD's error, Q, step and random stream, and QSGD's step count are each
worker's own and go into its checkpoints (``state_dicts``, one a worker held): a resume goes on exactly, to the
all-reduce's rounding.

Error feedback here keeps its error in gradient units, before the optimizer: the optimizer's momentum and lr
apply to what was sent, and the error held back is sent later at a later step's lr (docs/strategies.md).
"""

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.futures import Future
from typing_extensions import override

from psgd.choices import COMPRESSION_KEYS, COMPRESSIONS
from psgd.strategies.collective import Distributed, Stacked, future_for

STATEFUL = ("powersgd", "topk", "sign", "qsgd")  # each worker's state goes into checkpoints
QSGD_CHUNK = 512  # entries sharing one norm (the QSGD paper's bucket size)

Grads = list[tuple[int, Tensor]]  # (a parameter's index among the model's, its gradients as rows [R, numel])


def write_rows(grads: Grads, mean: Tensor) -> None:
    """The flat `mean` (over `grads`' parameters, in their order) into every worker's row of each."""
    for (_, g), part in zip(grads, mean.split([g.shape[1] for _, g in grads]), strict=True):
        g.copy_(part.expand_as(g))


def mean_into(grads: Grads, world: int) -> Callable[[Future], None]:
    """A future's callback: its sum over the `world` workers, divided by them, into `grads` (write_rows)."""

    def write(fut: Future) -> None:
        write_rows(grads, fut.value().div_(world))

    return write


def stacked_errors(states: list[dict[str, Any]]) -> list[Tensor | None]:
    """Each parameter's error in the workers' `states` (state_dicts' form) as rows [R, numel]; None where none."""
    errors = zip(*(s["error"] for s in states), strict=True)
    return [None if e[0] is None else torch.stack(e) for e in errors]


class Compressor:
    """DDP's gradient exchange: every worker's gradients become the workers' mean (`exchange`, on rows; `hook`, it
    as a DDP communication hook), counted: `payload_bytes` (what the method's encoding sends), `sent_bytes` (what
    psgd hands to torch.distributed, as gloo or NCCL carries it) and `calls` (collectives), a worker's, since the
    last `take_count`. This class is the plain mean (in a process, `Plain` is torch's own hook).

    Args:
        comm: how the workers exchange (psgd.strategies.collective; None: torch.distributed's default group).
        params: the model's parameters, in its order (one worker's).
    """

    name = "none"
    dtype: torch.dtype | None = None  # what the mean is sent as (None: the gradients' own)

    def __init__(self, comm: Distributed | Stacked | None, params: list[nn.Parameter]) -> None:
        self.comm = comm or Distributed()
        self.world = self.comm.size
        self.index = {id(p): i for i, p in enumerate(params)}
        self.payload_bytes = self.sent_bytes = self.calls = 0

    def count(self, payload: float, sent: int, calls: int = 1) -> None:
        self.payload_bytes += math.ceil(payload)
        self.sent_bytes += sent
        self.calls += calls

    def take_count(self) -> tuple[int, int, int]:
        """(payload bytes, sent bytes, collectives) of a worker since the last call."""
        count = (self.payload_bytes, self.sent_bytes, self.calls)
        self.payload_bytes = self.sent_bytes = self.calls = 0
        return count

    def hook(self, _state: Any, bucket: dist.GradBucket) -> Future[Tensor]:
        """DDP's communication hook: the bucket's gradients exchanged; a future of the bucket, their mean (or of the
        exchange's error: DDP must not go on with a bucket that was not exchanged)."""
        buffer = bucket.buffer()
        grads = [
            (self.index[id(p)], g.view(1, -1)) for p, g in zip(bucket.parameters(), bucket.gradients(), strict=True)
        ]

        def exchanged(fut: Future) -> Tensor:
            fut.value()  # raises the exchange's error
            return buffer

        return self.exchange(grads, bucket.is_last()).then(exchanged)

    def exchange(self, grads: Grads, last: bool = True) -> Future[None]:
        """Every worker's gradients `grads` replaced by the workers' mean, as the method approximates it; a future
        done once they are. `last`: the step's last gradients (DDP hands them over bucket by bucket)."""
        flat = torch.cat([g for _, g in grads], dim=1).to(self.dtype or grads[0][1].dtype).div_(self.world)
        size = flat.shape[1] * flat.element_size()
        self.count(size, size)
        return self.comm.sum_async(flat).then(lambda fut: write_rows(grads, fut.value()))

    def state_dicts(self) -> list[dict[str, Any]]:
        """Each worker's state held here, in `comm.ranks`' order."""
        return [{} for _ in self.comm.ranks]

    def load_state_dicts(self, states: list[dict[str, Any]]) -> None:
        """The states of the workers held here (`state_dicts`' form)."""


class Plain(Compressor):
    """none: in a process, DDP's own averaging, torch's ``allreduce_hook`` on the bucket."""

    @override
    def hook(self, _state: Any, bucket: dist.GradBucket) -> Future[Tensor]:
        size = bucket.buffer().numel() * bucket.buffer().element_size()
        self.count(size, size)
        return allreduce_hook(None, bucket)


class HalfPrecision(Compressor):
    """fp16 or bf16: the gradients cast down, divided by the workers and summed (torch's own hooks' arithmetic)."""

    def __init__(self, comm: Distributed | Stacked | None, params: list[nn.Parameter], name: str) -> None:
        super().__init__(comm, params)
        self.name = name
        self.dtype = torch.float16 if name == "fp16" else torch.bfloat16


def orthogonalise(m: Tensor) -> Tensor:
    """m's columns orthonormalised in place (m is rows x r, r <= rows): Gram-Schmidt for r <= 2 and half
    precisions, else QR, as torch's PowerSGD does; an all-zero column stays zero (torch's gives NaN)."""
    if m.shape[1] > 2 and m.dtype not in (torch.float16, torch.bfloat16):
        return m.copy_(torch.linalg.qr(m).Q)
    for i in range(m.shape[1]):
        col = m[:, i : i + 1]
        norm = torch.linalg.vector_norm(col)
        col.copy_(torch.where(norm > 0, col / norm, 0))
        if i + 1 < m.shape[1]:
            rest = m[:, i + 1 :]
            rest -= (col * rest).sum(dim=0, keepdim=True) * col
    return m


class PowerSGD(Compressor):
    """Rank-r PowerSGD with error feedback and warm start, per parameter (the module docstring). Its P is summed
    before the exchange returns (Q needs it), the rest completes its future. Q, the step and the random stream
    are the same on every worker; the error is each worker's."""

    name = "powersgd"

    def __init__(
        self,
        comm: Distributed | Stacked | None,
        params: list[nn.Parameter],
        rank: int,
        start_step: int,
        seed: int = 0,
        min_compression_rate: float = 2,
    ) -> None:
        super().__init__(comm, params)
        self.rank, self.start_step, self.min_compression_rate = rank, start_step, min_compression_rate
        self.shapes = [p.shape for p in params]
        self.step = 0  # the steps whose every gradient this compressor has exchanged
        self.error: list[Tensor | None] = [None] * len(params)  # a compressed matrix's error, rows [R, numel]
        self.q: list[Tensor | None] = [None] * len(params)  # a compressed matrix's last Q (cols x r)
        self.rng = np.random.RandomState(seed)  # the first Q's seeds, as torch's PowerSGDState.rng draws them

    def matrix_shape(self, i: int) -> tuple[int, int]:
        """Parameter i as a matrix: its first dimension x the rest."""
        shape = self.shapes[i]
        rows = shape[0] if len(shape) else 1
        return rows, math.prod(shape) // max(rows, 1)

    def matrix_rank(self, i: int) -> int | None:
        """Parameter i's rank of approximation, or None where compressing gains less than `min_compression_rate`
        (torch's ``_should_compress``)."""
        rows, cols = self.matrix_shape(i)
        r = min(rows, cols, self.rank)
        return None if (rows + cols) * r * self.min_compression_rate >= rows * cols else r

    @override
    def exchange(self, grads: Grads, last: bool = True) -> Future[None]:
        if self.step < self.start_step:
            self.step += last
            return super().exchange(grads, last)
        first = self.step == self.start_step  # the run's first compressed step
        self.step += last
        matrices: list[tuple[int, Tensor, int]] = []  # (parameter index, rows viewed [R, rows, cols], rank)
        plain: Grads = []
        for i, g in grads:
            r = self.matrix_rank(i)
            if r is None:
                plain.append((i, g))
            else:
                matrices.append((i, g.view(len(g), *self.matrix_shape(i)), r))
        for i, m, _ in matrices:
            if self.error[i] is not None:
                m.add_(self.error[i].view_as(m))
        before = [m.clone() for _, m, _ in matrices]
        self.first_qs(matrices, first, grads[0][1].dtype, grads[0][1].device)
        qs = [orthogonalise(self.q[i]) for i, _, _ in matrices]
        futures = []
        if plain:  # issued first, as torch's hook does
            futures.append(self.comm.sum_async(torch.cat([g for _, g in plain], dim=1)))
        ps = []
        if matrices:
            p_rows = torch.cat([(m @ q).reshape(len(m), -1) for (_, m, _), q in zip(matrices, qs, strict=True)], 1)
            p_sum = self.comm.sum_async(p_rows).wait()  # Q needs P: waited for here, on every worker in one order
            ps = [orthogonalise(p) for p in self.split(p_sum, [(m.shape[1], r) for _, m, r in matrices])]
            q_rows = [(m.transpose(1, 2) @ p).reshape(len(m), -1) for (_, m, _), p in zip(matrices, ps, strict=True)]
            futures.append(self.comm.sum_async(torch.cat(q_rows, dim=1)))
        entries = sum(g.shape[1] for _, g in plain) + sum((m.shape[1] + m.shape[2]) * r for _, m, r in matrices)
        size = entries * grads[0][1].element_size()
        self.count(size, size, calls=bool(plain) + 2 * bool(matrices))

        result = future_for(grads[0][1])

        def decompress(done: Future) -> None:
            try:
                sums = [fut.wait() for fut in done.value()]  # NCCL: the stream waits for the collectives
                if plain:
                    write_rows(plain, sums.pop(0).div_(self.world))
                if matrices:
                    shapes = [(m.shape[2], r) for _, m, r in matrices]
                    q_mean = sums.pop(0).div_(self.world)
                    for (i, m, _), p, q, old in zip(matrices, ps, self.split(q_mean, shapes), before, strict=True):
                        m.copy_(p @ q.T)
                        self.q[i] = q.clone()
                        self.error[i] = (old - m).reshape(len(m), -1)
            except BaseException as e:  # DDP waits on the bucket's future: it must end, with the error
                result.set_exception(e)
                raise
            result.set_result(None)

        if futures:
            torch.futures.collect_all(futures).then(decompress)
        else:
            result.set_result(None)
        return result

    @staticmethod
    def split(flat: Tensor, shapes: list[tuple[int, int]]) -> list[Tensor]:
        sizes = [a * b for a, b in shapes]
        return [t.view(shape) for t, shape in zip(flat.split(sizes), shapes, strict=True)]

    def first_qs(
        self, matrices: list[tuple[int, Tensor, int]], first: bool, dtype: torch.dtype, device: torch.device
    ) -> None:
        """Random Qs for the matrices that have none yet, from one seed of `rng` for the exchange (a DDP bucket),
        drawn on the CPU in torch's order (the matrices grouped by shape): the same on every worker. At the run's
        `first` compressed step every bucket draws its seed, one with no matrix too, as torch's hook does."""
        by_shape: dict[tuple[int, ...], list[tuple[int, int, int]]] = {}
        for i, m, r in matrices:
            if self.q[i] is None:
                by_shape.setdefault(tuple(m.shape[1:]), []).append((i, m.shape[2], r))
        if not by_shape and not first:
            return
        generator = torch.Generator().manual_seed(int(self.rng.randint(1_000_000_000)))
        for same in by_shape.values():
            for i, cols, r in same:
                self.q[i] = torch.randn(cols, r, generator=generator, dtype=dtype).to(device)

    @override
    def state_dicts(self) -> list[dict[str, Any]]:
        name, keys, pos, has_gauss, gauss = self.rng.get_state()
        rng = [name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss]
        return [
            {"step": self.step, "error": [e if e is None else e[r] for e in self.error], "q": list(self.q), "rng": rng}
            for r in range(len(self.comm.ranks))
        ]

    @override
    def load_state_dicts(self, states: list[dict[str, Any]]) -> None:
        state = states[0]
        if not isinstance(state.get("q"), list):  # psgd 0.2 kept it per bucket: no parameter's to take
            return
        self.step, self.q = state["step"], list(state["q"])
        self.error = stacked_errors(states)
        name, keys, pos, has_gauss, gauss = state["rng"]
        self.rng.set_state((name, keys.cpu().numpy().astype(np.uint32), pos, has_gauss, gauss))


class ErrorFeedback(Compressor):
    """A compressor that keeps each worker's error e per parameter: it compresses p = g + e (`with_error`), and e
    becomes p - what was sent (`keep_error`)."""

    def __init__(self, comm: Distributed | Stacked | None, params: list[nn.Parameter]) -> None:
        super().__init__(comm, params)
        self.error: list[Tensor | None] = [None] * len(params)  # rows [R, numel]

    def with_error(self, grads: Grads) -> tuple[Tensor, Grads]:
        """p = g + e over `grads`, as new rows [R, sum of numel], and each parameter's view of them."""
        p = torch.cat([g + self.error[i] if self.error[i] is not None else g for i, g in grads], dim=1)
        parts = p.split([g.shape[1] for _, g in grads], dim=1)
        return p, [(i, v) for (i, _), v in zip(grads, parts, strict=True)]

    def keep_error(self, error: Tensor, views: Grads) -> None:
        for (i, _), e in zip(views, error.split([v.shape[1] for _, v in views], dim=1), strict=True):
            self.error[i] = e.clone()

    @override
    def state_dicts(self) -> list[dict[str, Any]]:
        return [{"error": [e if e is None else e[r] for e in self.error]} for r in range(len(self.comm.ranks))]

    @override
    def load_state_dicts(self, states: list[dict[str, Any]]) -> None:
        self.error = stacked_errors(states)


class TopK(ErrorFeedback):
    """Top-k of each worker's whole p = g + e, as the paper selects from the full vector: an exchange holds its
    gradients until the step's last (DDP's last bucket), then selects from every parameter's p in the parameters'
    own order (so that the selection does not depend on DDP's buckets), gathers the workers' values and indices
    once, and completes every held exchange."""

    name = "topk"

    def __init__(self, comm: Distributed | Stacked | None, params: list[nn.Parameter], ratio: float) -> None:
        super().__init__(comm, params)
        self.ratio = ratio
        self.held: list[tuple[Grads, Future[None]]] = []  # this step's exchanges so far, and their futures

    @override
    def exchange(self, grads: Grads, last: bool = True) -> Future[None]:
        future = future_for(grads[0][1])
        self.held.append((grads, future))
        if not last:
            return future
        held, self.held = self.held, []
        grads = sorted((pair for step, _ in held for pair in step), key=lambda pair: pair[0])
        p, views = self.with_error(grads)
        top = p.abs().topk(math.ceil(self.ratio * p.shape[1]), dim=1, sorted=False).indices
        values = p.gather(1, top)
        self.keep_error(p.scatter(1, top, 0.0), views)
        top32 = top.to(torch.int32)
        size = top.shape[1] * (values.element_size() + top32.element_size())
        self.count(size, size, calls=2)

        def mean(done: Future) -> None:
            try:
                every_values, every_top = done.value()
                out = torch.zeros(p.shape[1], dtype=p.dtype, device=p.device)
                for v, i in zip(every_values, every_top, strict=True):
                    out.index_add_(0, i.long(), v)
                write_rows(grads, out.div_(self.world))
            except BaseException as e:  # DDP waits on every bucket's future: each must end, with the error
                for _, waiting in held:
                    waiting.set_exception(e)
                raise
            for _, waiting in held:
                waiting.set_result(None)

        self.comm.gather_async([values, top32]).then(mean)
        return future


def scaled_sign(v: Tensor) -> Tensor:
    """The scaled sign (|v|_1 / n) sign(v) of a parameter's v (over its last dimension: rows each their own)."""
    return v.abs().sum(-1, keepdim=True).div_(v.shape[-1]) * v.sign()


def sign_bytes(n: int) -> int:
    """The payload of a scaled sign of n entries: a bit each and one float."""
    return math.ceil(n / 8) + 4


class Sign(ErrorFeedback):
    name = "sign"

    @override
    def exchange(self, grads: Grads, last: bool = True) -> Future[None]:
        p, views = self.with_error(grads)
        c = torch.cat([scaled_sign(v) for _, v in views], dim=1)
        self.keep_error(p - c, views)
        payload = sum(sign_bytes(v.shape[1]) for _, v in views)
        self.count(payload, c.shape[1] * c.element_size())
        return self.comm.sum_async(c, payload).then(mean_into(grads, self.world))


def qsgd_quantise(v: Tensor, levels: int, generator: torch.Generator) -> Tensor:
    """QSGD's unbiased stochastic quantisation of v to `levels` levels per chunk of QSGD_CHUNK entries."""
    chunks = torch.nn.functional.pad(v, (0, -v.numel() % QSGD_CHUNK)).view(-1, QSGD_CHUNK)
    norms = chunks.norm(dim=1, keepdim=True)
    scaled = chunks.abs() / norms.clamp_min(torch.finfo(v.dtype).tiny) * levels
    lower = scaled.floor()
    draws = torch.rand(scaled.shape, generator=generator, dtype=v.dtype, device=generator.device).to(v.device)
    xi = lower + (draws < scaled - lower)
    return (norms * chunks.sign() * xi / levels).reshape(-1)[: v.numel()]


def qsgd_bits(levels: int) -> int:
    """Bits per entry of QSGD's fixed-length code: xi in 0..s and a sign are 2s + 1 symbols."""
    return math.ceil(math.log2(2 * levels + 1))


def qsgd_bytes(n: int, levels: int) -> int:
    """The payload of n entries quantised by QSGD: qsgd_bits each and a float per chunk."""
    return math.ceil(n * qsgd_bits(levels) / 8) + math.ceil(n / QSGD_CHUNK) * 4


def seeded(generator: torch.Generator, *parts: int) -> torch.Generator:
    """`generator` seeded from `parts` (e.g. seed, rank, step, parameter): one stream per such tuple."""
    state = np.random.SeedSequence(list(parts)).generate_state(1, np.uint64)[0]
    return generator.manual_seed(int(state) >> 1)


class QSGD(Compressor):
    """QSGD per parameter; each worker's draws for each parameter at each step from a stream seeded by (seed, rank,
    step, parameter), so that a resumed run draws what the uninterrupted one would whatever the buckets."""

    name = "qsgd"

    def __init__(self, comm: Distributed | Stacked | None, params: list[nn.Parameter], levels: int, seed: int = 0):
        super().__init__(comm, params)
        self.levels, self.seed = levels, seed
        self.step = 0  # the steps whose every gradient this compressor has exchanged
        self.generator: torch.Generator | None = None  # on the gradients' device

    @override
    def exchange(self, grads: Grads, last: bool = True) -> Future[None]:
        if self.generator is None:
            self.generator = torch.Generator(device=grads[0][1].device)
        parts = []
        for i, g in grads:
            rows = [  # each worker's own stream, seeded just before its draws (one generator serves them in turn)
                qsgd_quantise(v, self.levels, seeded(self.generator, self.seed, rank, self.step, i))
                for rank, v in zip(self.comm.ranks, g, strict=True)
            ]
            parts.append(torch.stack(rows))
        q = torch.cat(parts, dim=1)
        self.step += last
        payload = sum(qsgd_bytes(g.shape[1], self.levels) for _, g in grads)
        self.count(payload, q.shape[1] * q.element_size())
        return self.comm.sum_async(q, payload).then(mean_into(grads, self.world))

    @override
    def state_dicts(self) -> list[dict[str, Any]]:
        return [{"step": self.step} for _ in self.comm.ranks]

    @override
    def load_state_dicts(self, states: list[dict[str, Any]]) -> None:
        self.step = states[0].get("step", 0)  # psgd 0.2 kept a generator's state: a run resumed from it draws anew


def build_compressor(
    name: str,
    comm: Distributed | Stacked | None,
    params: list[nn.Parameter],
    seed: int = 0,
    powersgd_rank: int = COMPRESSION_KEYS["powersgd_rank"][1],
    powersgd_start_step: int = COMPRESSION_KEYS["powersgd_start_step"][1],
    topk_ratio: float = COMPRESSION_KEYS["topk_ratio"][1],
    qsgd_levels: int = COMPRESSION_KEYS["qsgd_levels"][1],
) -> Compressor:
    """The compressor `name` (of psgd.choices.COMPRESSIONS) of the workers `comm` holds, over one worker's `params`;
    a method's settings default to psgd.choices.COMPRESSION_KEYS' (what the config's null stands for)."""
    if name in ("fp16", "bf16"):
        return HalfPrecision(comm, params, name)
    if name == "powersgd":
        return PowerSGD(comm, params, powersgd_rank, powersgd_start_step, seed)
    if name == "topk":
        return TopK(comm, params, topk_ratio)
    if name == "sign":
        return Sign(comm, params)
    if name == "qsgd":
        return QSGD(comm, params, qsgd_levels, seed)
    if name not in COMPRESSIONS:
        raise ValueError(f"compression={name!r} is invalid: use one of {', '.join(COMPRESSIONS)}")
    return Plain(comm, params)
