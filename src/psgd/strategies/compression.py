"""Gradient compression for DDP: one communication hook per method, each turning a bucket of this worker's
gradients into the bucket of all workers' mean gradient (what DDP's own all-reduce gives), and counting the
payload this worker hands to torch.distributed.

- ``none``: torch's ``allreduce_hook``, DDP's own averaging.
- ``fp16``, ``bf16``: torch's ``fp16_compress_hook`` / ``bf16_compress_hook``: the bucket all-reduced in half
  precision.
- ``powersgd`` (Vogels, Karimireddy and Jaggi, 2019, "PowerSGD: Practical Low-Rank Gradient Compression"):
  each gradient matrix M (a tensor viewed as rows x the rest) with error feedback, M <- M + e, approximated
  at rank r by one power iteration warm-started from the last step's Q: P = M Q, P all-reduced and
  orthogonalised, Q = M^T P, Q all-reduced and averaged, M ~ P Q^T, e <- M - P Q^T. Tensors too small to gain
  (``min_compression_rate``) are all-reduced as they are, without error. A plain all-reduce before
  ``start_step``. The arithmetic of torch's ``powerSGD_hook``, with its collectives issued in the hook in one
  order on every rank (torch's issues them from future callbacks, whose order differs between ranks when a
  model has several buckets: gloo then fails, pytorch#58467).
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
worker's own and go into its checkpoints (``state_dict``): a resume goes on exactly, to the all-reduce's rounding.

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
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
    allreduce_hook,
    bf16_compress_hook,
    fp16_compress_hook,
)
from torch.futures import Future
from typing_extensions import override

from psgd.choices import COMPRESSION_KEYS, COMPRESSIONS

STATEFUL = ("powersgd", "topk", "sign", "qsgd")  # each worker's state goes into checkpoints
QSGD_CHUNK = 512  # entries sharing one norm (the QSGD paper's bucket size)


class Compressor:
    """A DDP comm hook (``hook(state, bucket)``) with its count: `payload_bytes` (what the method's encoding
    sends), `sent_bytes` (what psgd handed to torch.distributed, as gloo or NCCL carries it) and `calls`
    (collectives), since the last `take_count`."""

    name = "none"

    def __init__(self, group: dist.ProcessGroup | None, params: list[nn.Parameter]) -> None:
        self.group = group
        self.world = dist.get_world_size(group)
        self.index = {id(p): i for i, p in enumerate(params)}
        self.payload_bytes = self.sent_bytes = self.calls = 0

    def count(self, payload: float, sent: int, calls: int = 1) -> None:
        self.payload_bytes += math.ceil(payload)
        self.sent_bytes += sent
        self.calls += calls

    def take_count(self) -> tuple[int, int, int]:
        """(payload bytes, sent bytes, collectives) since the last call."""
        count = (self.payload_bytes, self.sent_bytes, self.calls)
        self.payload_bytes = self.sent_bytes = self.calls = 0
        return count

    def hook(self, _state: Any, bucket: dist.GradBucket) -> Future[Tensor]:
        """The bucket's mean gradient over the workers (a future of it)."""
        size = bucket.buffer().numel() * bucket.buffer().element_size()
        self.count(size, size)
        return allreduce_hook(self.group, bucket)

    def parameters(self, bucket: dist.GradBucket) -> list[tuple[int, Tensor]]:
        """The bucket's parameters as (index among the model's parameters, flat view of its gradient in the
        bucket's buffer), in the bucket's order."""
        return [(self.index[id(p)], g.view(-1)) for p, g in zip(bucket.parameters(), bucket.gradients(), strict=True)]

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class HalfPrecision(Compressor):
    """fp16 or bf16: the bucket cast down and all-reduced (torch's own hooks)."""

    def __init__(self, group: dist.ProcessGroup | None, params: list[nn.Parameter], name: str) -> None:
        super().__init__(group, params)
        self.name = name
        self._hook = fp16_compress_hook if name == "fp16" else bf16_compress_hook

    @override
    def hook(self, _state: Any, bucket: dist.GradBucket) -> Future[Tensor]:
        size = bucket.buffer().numel() * 2
        self.count(size, size)
        return self._hook(self.group, bucket)


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
    """Rank-r PowerSGD with error feedback and warm start, per parameter (the module docstring). Its P all-reduce
    is waited for in the hook (Q needs it), the rest completes the bucket's future."""

    name = "powersgd"

    def __init__(
        self,
        group: dist.ProcessGroup | None,
        params: list[nn.Parameter],
        rank: int,
        start_step: int,
        seed: int = 0,
        min_compression_rate: float = 2,
    ) -> None:
        super().__init__(group, params)
        self.rank, self.start_step, self.min_compression_rate = rank, start_step, min_compression_rate
        self.step = 0  # the steps whose every bucket this hook has seen
        self.error: list[Tensor | None] = [None] * len(params)  # a compressed matrix's error, flat
        self.q: list[Tensor | None] = [None] * len(params)  # a compressed matrix's last Q (cols x r)
        self.rng = np.random.RandomState(seed)  # the first Q's seeds, as torch's PowerSGDState.rng draws them

    def matrix(self, grad: Tensor) -> tuple[Tensor, int] | None:
        """The gradient as the matrix PowerSGD compresses (rows = the parameter's first dimension) and its rank,
        or None where compressing gains less than `min_compression_rate` (torch's ``_should_compress``)."""
        rows = grad.shape[0] if grad.ndim else 1
        cols = grad.numel() // max(rows, 1)
        r = min(rows, cols, self.rank)
        if (rows + cols) * r * self.min_compression_rate >= rows * cols:
            return None
        return grad.view(rows, cols), r

    @override
    def hook(self, _state: Any, bucket: dist.GradBucket) -> Future[Tensor]:
        buffer = bucket.buffer()
        if self.step < self.start_step:
            self.step += bucket.is_last()
            size = buffer.numel() * buffer.element_size()
            self.count(size, size)
            return allreduce_hook(self.group, bucket)
        first = self.step == self.start_step  # the run's first compressed step
        self.step += bucket.is_last()
        matrices: list[tuple[int, Tensor, int]] = []  # (parameter index, matrix view, rank)
        plain: list[Tensor] = []
        for p, g in zip(bucket.parameters(), bucket.gradients(), strict=True):
            found = self.matrix(g)
            if found is None:
                plain.append(g.view(-1))
            else:
                matrices.append((self.index[id(p)], *found))
        for i, m, _ in matrices:
            if self.error[i] is not None:
                m.add_(self.error[i].view_as(m))
        before = [m.clone() for _, m, _ in matrices]
        self.first_qs(matrices, first, buffer.dtype, buffer.device)
        qs = [orthogonalise(self.q[i]) for i, _, _ in matrices]
        futures = []
        plain_flat = torch.cat(plain) if plain else None
        if plain_flat is not None:  # issued first, as torch's hook does
            futures.append(dist.all_reduce(plain_flat, group=self.group, async_op=True).get_future())
        ps = []
        if matrices:
            p_flat = torch.cat([(m @ q).reshape(-1) for (_, m, _), q in zip(matrices, qs, strict=True)])
            dist.all_reduce(p_flat, group=self.group)  # Q needs P: waited for here, on every rank in one order
            ps = [orthogonalise(p) for p in self.split(p_flat, [(m.shape[0], r) for _, m, r in matrices])]
            q_flat = torch.cat([(m.T @ p).reshape(-1) for (_, m, _), p in zip(matrices, ps, strict=True)])
            futures.append(dist.all_reduce(q_flat, group=self.group, async_op=True).get_future())
        entries = (plain_flat.numel() if plain_flat is not None else 0) + sum(
            (m.shape[0] + m.shape[1]) * r for _, m, r in matrices
        )
        calls = (plain_flat is not None) + 2 * bool(matrices)
        self.count(entries * buffer.element_size(), entries * buffer.element_size(), calls=calls)

        result = _future_for(buffer)

        def decompress(done: Future) -> None:
            try:
                for fut in done.value():
                    fut.wait()  # NCCL: the stream waits for the collective (its future completes when queued)
                if plain_flat is not None:
                    means = plain_flat.div_(self.world).split([g.numel() for g in plain])
                    for g, mean in zip(plain, means, strict=True):
                        g.copy_(mean)
                if matrices:
                    q_flat.div_(self.world)
                    shapes = [(m.shape[1], r) for _, m, r in matrices]
                    for (i, m, _), p, q, old in zip(matrices, ps, self.split(q_flat, shapes), before, strict=True):
                        torch.matmul(p, q.T, out=m)
                        self.q[i] = q.clone()
                        self.error[i] = (old - m).reshape(-1)
            except BaseException as e:  # DDP waits on the bucket's future: it must end, with the error
                result.set_exception(e)
                raise
            result.set_result(buffer)

        if futures:
            torch.futures.collect_all(futures).then(decompress)
        else:
            result.set_result(buffer)
        return result

    @staticmethod
    def split(flat: Tensor, shapes: list[tuple[int, int]]) -> list[Tensor]:
        sizes = [a * b for a, b in shapes]
        return [t.view(shape) for t, shape in zip(flat.split(sizes), shapes, strict=True)]

    def first_qs(
        self, matrices: list[tuple[int, Tensor, int]], first: bool, dtype: torch.dtype, device: torch.device
    ) -> None:
        """Random Qs for the matrices that have none yet, from one seed of `rng` for the bucket, drawn on the CPU
        in torch's order (the matrices grouped by shape): the same on every worker. At the run's `first`
        compressed step every bucket draws its seed, one with no matrix too, as torch's hook does."""
        by_shape: dict[tuple[int, ...], list[tuple[int, int, int]]] = {}
        for i, m, r in matrices:
            if self.q[i] is None:
                by_shape.setdefault(tuple(m.shape), []).append((i, m.shape[1], r))
        if not by_shape and not first:
            return
        generator = torch.Generator().manual_seed(int(self.rng.randint(1_000_000_000)))
        for same in by_shape.values():
            for i, cols, r in same:
                self.q[i] = torch.randn(cols, r, generator=generator, dtype=dtype).to(device)

    @override
    def state_dict(self) -> dict[str, Any]:
        name, keys, pos, has_gauss, gauss = self.rng.get_state()
        return {
            "step": self.step,
            "error": list(self.error),
            "q": list(self.q),
            "rng": [name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss],
        }

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state.get("q"), list):  # psgd 0.2 kept it per bucket: no parameter's to take
            return
        self.step, self.error, self.q = state["step"], list(state["error"]), list(state["q"])
        name, keys, pos, has_gauss, gauss = state["rng"]
        self.rng.set_state((name, keys.cpu().numpy().astype(np.uint32), pos, has_gauss, gauss))


class ErrorFeedback(Compressor):
    """A compressor that keeps this worker's error e per parameter: it compresses p = g + e (`with_error`), and e
    becomes p - what was sent (`keep_error`)."""

    def __init__(self, group: dist.ProcessGroup | None, params: list[nn.Parameter]) -> None:
        super().__init__(group, params)
        self.error: list[Tensor | None] = [None] * len(params)

    def with_error(self, grads: list[tuple[int, Tensor]]) -> tuple[Tensor, list[tuple[int, Tensor]]]:
        """p = g + e over `grads` ((parameter index, flat gradient) pairs), as a new flat tensor, and the parameters
        as (index, flat view of p)."""
        p = torch.cat([g + self.error[i] if self.error[i] is not None else g for i, g in grads])
        return p, [(i, v) for (i, _), v in zip(grads, p.split([g.numel() for _, g in grads]), strict=True)]

    def keep_error(self, error: Tensor, views: list[tuple[int, Tensor]]) -> None:
        for (i, _), e in zip(views, error.split([v.numel() for _, v in views]), strict=True):
            self.error[i] = e.clone()

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"error": list(self.error)}

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.error = list(state["error"])


def _future_for(tensor: Tensor) -> Future[Tensor]:
    """A future a hook completes itself, for a result on `tensor`'s device (a CUDA result needs its device named)."""
    return Future(devices=[tensor.device]) if tensor.is_cuda else Future()


def _mean_into(bucket: dist.GradBucket, world: int) -> Callable[[Future], Tensor]:
    """A future's callback: its all-reduced sum, divided by the workers, as the bucket's result."""

    def mean(fut: Future) -> Tensor:
        return bucket.buffer().copy_(fut.value()[0].div_(world))

    return mean


class TopK(ErrorFeedback):
    """Top-k of the whole model's p = g + e, as the paper selects from the full vector: each bucket's hook holds its
    bucket until the step's last one, whose hook selects from every parameter's p in the parameters' own order (so
    that the selection does not depend on DDP's buckets), all-gathers once, and completes every bucket."""

    name = "topk"

    def __init__(self, group: dist.ProcessGroup | None, params: list[nn.Parameter], ratio: float) -> None:
        super().__init__(group, params)
        self.ratio = ratio
        self.waiting: list[tuple[Tensor, Future[Tensor]]] = []  # this step's earlier buckets and their futures
        self.grads: list[tuple[int, Tensor]] = []  # their parameters' gradients, flat views into the buckets

    @override
    def hook(self, _state: Any, bucket: dist.GradBucket) -> Future[Tensor]:
        future = _future_for(bucket.buffer())
        self.waiting.append((bucket.buffer(), future))
        self.grads += self.parameters(bucket)
        if not bucket.is_last():
            return future
        grads, waiting = sorted(self.grads, key=lambda pair: pair[0]), self.waiting
        self.grads, self.waiting = [], []
        p, views = self.with_error(grads)
        top = p.abs().topk(math.ceil(self.ratio * p.numel()), sorted=False).indices
        values = p[top]
        self.keep_error(p.index_put((top,), torch.zeros_like(values)), views)
        top32 = top.to(torch.int32)
        every_values = [torch.empty_like(values) for _ in range(self.world)]
        every_top = [torch.empty_like(top32) for _ in range(self.world)]
        size = top.numel() * (values.element_size() + top32.element_size())
        self.count(size, size, calls=2)
        futures = [
            dist.all_gather(every_values, values, group=self.group, async_op=True).get_future(),
            dist.all_gather(every_top, top32, group=self.group, async_op=True).get_future(),
        ]

        def mean(done: Future) -> None:
            try:
                for fut in done.value():
                    fut.wait()  # NCCL: the stream waits for the all-gather (its future completes when queued)
                out = torch.zeros_like(p)
                for v, i in zip(every_values, every_top, strict=True):
                    out.index_add_(0, i.long(), v)
                for (_, g), mean in zip(grads, out.div_(self.world).split([g.numel() for _, g in grads]), strict=True):
                    g.copy_(mean)
            except BaseException as e:  # DDP waits on every bucket's future: each must end, with the error
                for _, held in waiting:
                    held.set_exception(e)
                raise
            for buffer, held in waiting:
                held.set_result(buffer)

        torch.futures.collect_all(futures).then(mean)
        return future


def scaled_sign(v: Tensor) -> Tensor:
    """One parameter's scaled sign, (|v|_1 / n) sign(v)."""
    return v.abs().sum().div_(v.numel()) * v.sign()


def sign_bytes(n: int) -> int:
    """The payload of a scaled sign of n entries: a bit each and one float."""
    return math.ceil(n / 8) + 4


class Sign(ErrorFeedback):
    name = "sign"

    @override
    def hook(self, _state: Any, bucket: dist.GradBucket) -> Future[Tensor]:
        p, views = self.with_error(self.parameters(bucket))
        c = torch.cat([scaled_sign(v) for _, v in views])
        self.keep_error(p - c, views)
        self.count(sum(sign_bytes(v.numel()) for _, v in views), c.numel() * c.element_size())
        return dist.all_reduce(c, group=self.group, async_op=True).get_future().then(_mean_into(bucket, self.world))


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
    """QSGD per parameter; each parameter's draws at each step from a stream seeded by (seed, rank, step,
    parameter), so that a resumed run draws what the uninterrupted one would whatever the buckets."""

    name = "qsgd"

    def __init__(self, group: dist.ProcessGroup | None, params: list[nn.Parameter], levels: int, seed: int = 0):
        super().__init__(group, params)
        self.levels, self.seed, self.rank = levels, seed, dist.get_rank(group)
        self.step = 0  # the steps whose every bucket this hook has seen
        self.generator: torch.Generator | None = None  # on the gradients' device

    @override
    def hook(self, _state: Any, bucket: dist.GradBucket) -> Future[Tensor]:
        g = bucket.buffer()
        if self.generator is None:
            self.generator = torch.Generator(device=g.device)
        parts = []
        for i, v in self.parameters(bucket):
            parts.append(qsgd_quantise(v, self.levels, seeded(self.generator, self.seed, self.rank, self.step, i)))
        q = torch.cat(parts)
        self.step += bucket.is_last()
        self.count(sum(qsgd_bytes(v.numel(), self.levels) for v in parts), q.numel() * q.element_size())
        return dist.all_reduce(q, group=self.group, async_op=True).get_future().then(_mean_into(bucket, self.world))

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = state.get("step", 0)  # psgd 0.2 kept a generator's state: a run resumed from it draws anew


def build_compressor(
    name: str,
    group: dist.ProcessGroup | None,
    params: list[nn.Parameter],
    seed: int = 0,
    powersgd_rank: int = COMPRESSION_KEYS["powersgd_rank"][1],
    powersgd_start_step: int = COMPRESSION_KEYS["powersgd_start_step"][1],
    topk_ratio: float = COMPRESSION_KEYS["topk_ratio"][1],
    qsgd_levels: int = COMPRESSION_KEYS["qsgd_levels"][1],
) -> Compressor:
    """The compressor `name` (of psgd.choices.COMPRESSIONS) for DDP over `params` in `group`; a method's settings
    default to psgd.choices.COMPRESSION_KEYS' (what the config's null stands for)."""
    if name in ("fp16", "bf16"):
        return HalfPrecision(group, params, name)
    if name == "powersgd":
        return PowerSGD(group, params, powersgd_rank, powersgd_start_step, seed)
    if name == "topk":
        return TopK(group, params, topk_ratio)
    if name == "sign":
        return Sign(group, params)
    if name == "qsgd":
        return QSGD(group, params, qsgd_levels, seed)
    if name not in COMPRESSIONS:
        raise ValueError(f"compression={name!r} is invalid: use one of {', '.join(COMPRESSIONS)}")
    return Compressor(group, params)
