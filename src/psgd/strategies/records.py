"""What a strategy records beside the run's own figures, and how metrics.json sums it: `Reports`, the side of the
contract a Lightning strategy implements for psgd's callbacks (its communication per epoch, its figures under
their TensorBoard tags, what it waited for the others, its report at the end), and the sums over a run's epochs
(each worker's bytes, collectives and seconds; the share of the time spent synchronising)."""

import math
from typing import Any, ClassVar

import torch

from psgd.strategies.collective import Distributed

FIGURES: dict[str, tuple[str, int]] = {}  # every strategy's figures (Reports.figures), as each class is defined


class Reports:
    """Lightning strategy mixin: what psgd's callbacks read of a strategy. One they do not find it on (Lightning's
    own, as one worker in-process has) sent nothing, has no figures and waited for no one."""

    figures: ClassVar[dict[str, tuple[str, int]]] = {}
    """epoch_figures' keys: (TensorBoard tag, decimals in metrics.json's history)."""
    report: dict[str, Any]
    """The end of training's figures, for metrics.json (its final checkpoint keeps a copy)."""
    waited_s: float = 0.0
    """The time this worker waited for the others since the start (s): what a straggler's sleep discounts."""
    _comm_impl: Distributed | None = None

    @property
    def comm(self) -> Distributed:
        """How the workers exchange (psgd.strategies.collective): torch.distributed's, one worker a process."""
        if self._comm_impl is None:
            self._comm_impl = Distributed(lambda: self.root_device)  # (known once the workers are set up)
        return self._comm_impl

    @comm.setter
    def comm(self, value: Any) -> None:
        self._comm_impl = value

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        FIGURES.update(cls.figures)

    def comm_count(self) -> list[list[float]]:
        """What each worker held here (`comm.ranks`) sent for training since the last call, a row each: [payload
        bytes, bytes as sent, collectives, seconds]."""
        return [[0, 0, 0, 0.0] for _ in self.comm.ranks]

    def epoch_figures(self) -> dict[str, float]:
        """This epoch's figures (keys of `figures`), the same on every worker (reduced over them)."""
        return {}


def allreduce_summary(history: list[dict[str, Any]]) -> dict[str, float]:
    """A DDP run's all-reduce: `allreduce_ms` and `allreduce_wait_ms` per step over its epochs, and
    `allreduce_wait_share`, the part of the training time spent waiting for it; {} for a run without one."""
    steps_before, steps, comm, wait, trained_s = 0, 0, 0.0, 0.0, 0.0
    for h in history:
        taken, steps_before = h["step"] - steps_before, h["step"]
        if h.get("allreduce_wait_ms") is None or taken <= 0:
            continue
        steps += taken
        comm += h["allreduce_ms"] * taken
        wait += h["allreduce_wait_ms"] * taken
        trained_s += h["epoch_s"]
    if not steps:
        return {}
    return {
        "allreduce_ms": round(comm / steps, 3),
        "allreduce_wait_ms": round(wait / steps, 3),
        "allreduce_wait_share": round(min(1.0, wait / 1000 / trained_s), 4) if trained_s > 0 else None,
    }


def time_share(history: list[dict[str, Any]], key: str) -> float | None:
    """The share of the training time the epochs that have `key` (seconds per epoch) spent so; None without."""
    spent = [(h[key], h["epoch_s"]) for h in history if h.get(key) is not None]
    trained_s = sum(t for _, t in spent)
    if not spent or trained_s <= 0:
        return None
    return round(min(1.0, sum(a for a, _ in spent) / trained_s), 4)


def sync_summary(history: list[dict[str, Any]]) -> dict[str, float]:
    """The figures of synchronising a run has: DDP's all-reduce (allreduce_summary), `averaging_share`
    (periodic model averaging's time in averaging) and `lock_wait_share` (locked HogWild's wait for the lock)."""
    shares = {
        "averaging_share": time_share(history, "averaging_s"),
        "lock_wait_share": time_share(history, "lock_wait_s"),
    }
    return {**allreduce_summary(history), **{k: v for k, v in shares.items() if v is not None}}


COMM_KEYS = ("comm_bytes", "comm_sent_bytes", "comm_calls", "comm_s")


def epoch_workers(strategy: Any, device: torch.device, steps: int, slept_s: float | None) -> dict[str, list]:
    """Every worker's figures of this epoch, in rank order, from one all-gather: its communication for training
    (COMM_KEYS, the strategy's `comm_count`; none for a strategy without one: payload bytes, bytes as sent,
    collectives, seconds, None where not timed), its optimizer `steps_per_worker` and, with stragglers
    (`slept_s` not None), `straggler_wait_s`, the time it slept."""
    reports = isinstance(strategy, Reports)
    own = strategy.comm_count() if reports else [[0, 0, 0, 0.0]]
    comm = strategy.comm if reports else Distributed(device)
    rows = [[*row, steps, slept_s or 0.0] for row in own]
    per_worker = list(zip(*comm.gather(rows), strict=True))
    figures = {key: [int(v) for v in values] for key, values in zip(COMM_KEYS[:3], per_worker, strict=False)}
    figures |= {"comm_s": [None if math.isnan(s) else round(s, 4) for s in per_worker[3]]}
    figures |= {"steps_per_worker": [int(v) for v in per_worker[4]]}
    return figures | ({"straggler_wait_s": [round(s, 4) for s in per_worker[5]]} if slept_s is not None else {})


def comm_summary(history: list[dict[str, Any]], at_end: list[list[float]] | None) -> dict[str, list]:
    """A run's communication per worker (COMM_KEYS): its epochs' and, `at_end`, what the strategy sent after the
    last epoch (model averaging's final average); {} for a record from before psgd counted it."""
    # one [[bytes, sent, calls, seconds] per worker] per epoch, and the end's
    counts = [list(zip(*(h[key] for key in COMM_KEYS), strict=True)) for h in history if "comm_bytes" in h]
    counts += [at_end] if at_end else []
    if not counts:
        return {}
    out = {}
    for i, key in enumerate(COMM_KEYS):
        out[key] = per_worker_sums([[entry[i] for entry in epoch] for epoch in counts], integers=key != "comm_s")
    return out


def per_worker_sums(epochs: list[list[float | None]], integers: bool = True) -> list[float | None]:
    """Each worker's sum over `epochs` (a value per worker each), None where it has none (comm_s on a GPU); a run
    resumed with another worker count has the ranks every epoch had."""
    per_worker = [[v for v in worker if v is not None] for worker in zip(*epochs, strict=False)]
    return [(int(sum(known)) if integers else round(sum(known), 4)) if known else None for known in per_worker]


def workers_summary(history: list[dict[str, Any]]) -> dict[str, list]:
    """Each worker's optimizer steps over the run (`steps_per_worker`) and, with stragglers, its sleep
    (`straggler_wait_s`); {} for a record without them."""
    out = {}
    for key in ("steps_per_worker", "straggler_wait_s"):
        epochs = [h[key] for h in history if key in h]
        if epochs:
            out[key] = per_worker_sums(epochs, integers=key == "steps_per_worker")
    return out
