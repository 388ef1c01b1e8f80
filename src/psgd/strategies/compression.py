"""Gradient compression for DDP: one communication hook per method, each turning a bucket of this worker's
gradients into the bucket of all workers' mean gradient (what DDP's own all-reduce gives), and counting the
payload this worker hands to torch.distributed.

- ``none``: torch's ``allreduce_hook``, DDP's own averaging.
- ``fp16``, ``bf16``: torch's ``fp16_compress_hook`` / ``bf16_compress_hook``: the bucket all-reduced in half
  precision.
- ``powersgd`` (Vogels, Karimireddy and Jaggi, 2019, "PowerSGD: Practical Low-Rank Gradient Compression"):
  torch's ``PowerSGDState`` + ``powerSGD_hook``: each gradient matrix M approximated as P Q^T of rank r by one
  power iteration, P and Q all-reduced; error feedback and warm start on; a plain all-reduce before
  ``start_step``.
- ``topk`` (Stich, Cordonnier and Jaggi, 2018, "Sparsified SGD with Memory"; Lin et al., 2018, "Deep Gradient
  Compression", without its extras): with this worker's error e, p = g + e; the k = ceil(ratio d) entries of p
  largest in magnitude are sent (values and indices, all-gathered); e <- p - sent; the mean of the workers'
  sparse vectors is the result.
- ``sign`` (Karimireddy et al., 2019, "Error Feedback Fixes SignSGD"): p = g + e; c = (|p|_1 / d) sign(p);
  e <- p - c; the all-reduced mean of c. Its payload is 1 bit per entry and one float; gloo carries c as fp32.
- ``qsgd`` (Alistarh et al., 2017, "QSGD"): each chunk of 512 entries v quantised to s levels,
  q_i = |v|_2 sign(v_i) xi_i / s with xi_i = floor(s |v_i| / |v|_2) + Bernoulli(the remainder): unbiased, no
  error feedback; the all-reduced mean of q. Its payload is ceil(log2(s) + 1) bits per entry and a float per
  chunk; gloo carries q as fp32.

Error buffers are kept per parameter (DDP rebuilds its buckets after the first step), PowerSGD's state per
bucket as torch keeps it; both, and QSGD's random stream, are each worker's own and go into its checkpoints
(``state_dict``).
"""

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
    allreduce_hook,
    bf16_compress_hook,
    fp16_compress_hook,
)
from torch.futures import Future

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

    def hook(self, _state: Any, bucket: dist.GradBucket) -> Future[Tensor]:
        size = bucket.buffer().numel() * 2
        self.count(size, size)
        return self._hook(self.group, bucket)


class PowerSGD(Compressor):
    """torch's PowerSGD hook and state; its payload counted as torch's hook sends it (``_should_compress``'s
    rule: a matrix is compressed where that saves more than `min_compression_rate`)."""

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
        self.state = powerSGD_hook.PowerSGDState(
            process_group=group,
            matrix_approximation_rank=rank,
            start_powerSGD_iter=start_step,
            min_compression_rate=min_compression_rate,
            random_seed=seed,
            compression_stats_logging_frequency=2**62,  # psgd counts; torch's log lines stay out
        )

    def hook(self, _state: Any, bucket: dist.GradBucket) -> Future[Tensor]:
        buffer, st = bucket.buffer(), self.state
        if st.iter < st.start_powerSGD_iter:
            size = buffer.numel() * buffer.element_size()
            self.count(size, size)
        else:  # torch all-reduces the tensors it leaves uncompressed, then P, then Q
            entries = 0
            for grad in bucket.gradients():
                rows = grad.shape[0] if grad.ndim > 1 else 1
                cols = grad.numel() // max(rows, 1)
                r = min(rows, cols, st.matrix_approximation_rank)
                compressed = grad.ndim > 1 and (rows + cols) * r * st.min_compression_rate < rows * cols
                entries += (rows + cols) * r if compressed else grad.numel()
            self.count(entries * buffer.element_size(), entries * buffer.element_size(), calls=3)
        return powerSGD_hook.powerSGD_hook(st, bucket)

    def state_dict(self) -> dict[str, Any]:
        st = self.state
        name, keys, pos, has_gauss, gauss = st.rng.get_state()
        return {
            "iter": st.iter,
            "error": dict(st.error_dict),
            "p": dict(st.p_memory_dict),
            "q": dict(st.q_memory_dict),
            "rng": [name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        st = self.state
        st.iter = state["iter"]
        st.error_dict, st.p_memory_dict, st.q_memory_dict = dict(state["error"]), dict(state["p"]), dict(state["q"])
        name, keys, pos, has_gauss, gauss = state["rng"]
        st.rng.set_state((name, keys.cpu().numpy().astype(np.uint32), pos, has_gauss, gauss))


class ErrorFeedback(Compressor):
    """A compressor that keeps this worker's error e per parameter: `compress(p)` of p = g + e returns what is
    sent (dense) and e becomes p - sent."""

    def __init__(self, group: dist.ProcessGroup | None, params: list[nn.Parameter]) -> None:
        super().__init__(group, params)
        self.error: list[Tensor | None] = [None] * len(params)

    def with_error(self, bucket: dist.GradBucket) -> tuple[Tensor, list[int]]:
        """p = g + e for the bucket (a new flat tensor) and its parameters' indices."""
        indices = [self.index[id(p)] for p in bucket.parameters()]
        errors = [
            self.error[i] if self.error[i] is not None else torch.zeros_like(g).reshape(-1)
            for i, g in zip(indices, bucket.gradients(), strict=True)
        ]
        return bucket.buffer() + torch.cat(errors), indices

    def keep_error(self, error: Tensor, indices: list[int], bucket: dist.GradBucket) -> None:
        offset = 0
        for i, g in zip(indices, bucket.gradients(), strict=True):
            self.error[i] = error[offset : offset + g.numel()].clone()
            offset += g.numel()

    def state_dict(self) -> dict[str, Any]:
        return {"error": list(self.error)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.error = list(state["error"])


def _mean_into(bucket: dist.GradBucket, world: int) -> Callable[[Future], Tensor]:
    """A future's callback: its all-reduced sum, divided by the workers, as the bucket's result."""

    def mean(fut: Future) -> Tensor:
        return bucket.buffer().copy_(fut.value()[0].div_(world))

    return mean


class TopK(ErrorFeedback):
    name = "topk"

    def __init__(self, group: dist.ProcessGroup | None, params: list[nn.Parameter], ratio: float) -> None:
        super().__init__(group, params)
        self.ratio = ratio

    def hook(self, _state: Any, bucket: dist.GradBucket) -> Future[Tensor]:
        p, indices = self.with_error(bucket)
        k = math.ceil(self.ratio * p.numel())
        top = p.abs().topk(k, sorted=False).indices
        values = p[top]
        sent = torch.zeros_like(p).index_put_((top,), values)
        self.keep_error(p - sent, indices, bucket)
        top32 = top.to(torch.int32)
        every_values = [torch.empty_like(values) for _ in range(self.world)]
        every_top = [torch.empty_like(top32) for _ in range(self.world)]
        size = k * (values.element_size() + top32.element_size())
        self.count(size, size, calls=2)
        futures = [
            dist.all_gather(every_values, values, group=self.group, async_op=True).get_future(),
            dist.all_gather(every_top, top32, group=self.group, async_op=True).get_future(),
        ]

        def mean(_: Future) -> Tensor:
            out = bucket.buffer().zero_()
            for v, i in zip(every_values, every_top, strict=True):
                out.index_add_(0, i.long(), v)
            return out.div_(self.world)

        return torch.futures.collect_all(futures).then(mean)


class Sign(ErrorFeedback):
    name = "sign"

    def hook(self, _state: Any, bucket: dist.GradBucket) -> Future[Tensor]:
        p, indices = self.with_error(bucket)
        c = p.abs().sum().div_(p.numel()) * p.sign()
        self.keep_error(p - c, indices, bucket)
        self.count(math.ceil(p.numel() / 8) + 4, c.numel() * c.element_size())
        return dist.all_reduce(c, group=self.group, async_op=True).get_future().then(_mean_into(bucket, self.world))


def qsgd_quantise(v: Tensor, levels: int, generator: torch.Generator) -> Tensor:
    """QSGD's unbiased stochastic quantisation of v to `levels` levels per chunk of QSGD_CHUNK entries."""
    chunks = torch.nn.functional.pad(v, (0, -v.numel() % QSGD_CHUNK)).view(-1, QSGD_CHUNK)
    norms = chunks.norm(dim=1, keepdim=True)
    scaled = chunks.abs() / norms.clamp_min(torch.finfo(v.dtype).tiny) * levels
    lower = scaled.floor()
    xi = lower + (torch.rand(scaled.shape, generator=generator, dtype=v.dtype) < scaled - lower)
    return (norms * chunks.sign() * xi / levels).reshape(-1)[: v.numel()]


class QSGD(Compressor):
    name = "qsgd"

    def __init__(self, group: dist.ProcessGroup | None, params: list[nn.Parameter], levels: int, seed: int = 0):
        super().__init__(group, params)
        self.levels = levels
        self.generator = torch.Generator().manual_seed(seed * 1_000_003 + dist.get_rank(group))

    def hook(self, _state: Any, bucket: dist.GradBucket) -> Future[Tensor]:
        g = bucket.buffer()
        q = qsgd_quantise(g.detach().cpu(), self.levels, self.generator).to(g.device)
        bits = math.ceil(math.log2(self.levels) + 1)
        self.count(g.numel() * bits / 8 + math.ceil(g.numel() / QSGD_CHUNK) * 4, q.numel() * q.element_size())
        return dist.all_reduce(q, group=self.group, async_op=True).get_future().then(_mean_into(bucket, self.world))

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"].cpu())  # a CPU generator, whatever device the state came to


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
