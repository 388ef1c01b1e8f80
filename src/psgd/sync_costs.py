"""What synchronising the workers cost a run, summed from its per-epoch history for metrics.json."""

from typing import Any


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
