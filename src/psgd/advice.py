"""What to tell a user whose run took steps too large (it diverged, or learned nothing): the lr to set.

Under HogWild every worker's update lands on the one shared model, so P workers take about P times
one worker's step: the lr to name there is one worker's lr / P. This module imports no other psgd module.
"""

import math
from typing import Any


def hogwild_workers(strategy: str | None, workers: int | None) -> int | None:
    """The worker count of a HogWild run where several write into the one shared model, else None."""
    return workers if strategy == "hogwild" and workers is not None and workers > 1 else None


def scales_by_workers(settings: Any) -> bool:
    """Whether lr_scaling multiplied optimizer.lr by the worker count (lr_reference_batch=null; psgd.optim).

    Args:
        settings: a run's config or its metrics.json record (both keep the two keys).
    """
    return settings.get("lr_scaling") not in (None, "none") and settings.get("lr_reference_batch") is None


def step_advice(
    lr: float | None = None,
    hogwild_workers: int | str | None = None,
    optimizer_lr: float | None = None,
    by_workers: bool = False,
) -> str:
    """What to change when a run's steps were too large: the lr (the run's, where known), or a warm-up.

    Args:
        lr: the lr the run ran at (after lr_scaling), where known.
        hogwild_workers: HogWild's worker count, or "P" for several runs; None for any other strategy.
        optimizer_lr: the optimizer.lr that lr_scaling turned into `lr`.
        by_workers: lr_scaling scaled by the workers (lr_reference_batch=null). One worker then runs
            optimizer.lr itself, so the lr to set is optimizer.lr / P with lr_scaling=none (optimizer.lr / P
            alone would be scaled back up P-fold). Scaled by the batch, one worker runs `lr` too and
            optimizer.lr / P is scaled to its P-th.
    """
    scaled = bool(lr and optimizer_lr and not math.isclose(lr, optimizer_lr, rel_tol=1e-6))
    base = optimizer_lr if scaled else lr
    said = f"the run's lr is {lr:g}" if lr else ""
    if scaled:
        said += f": lr_scaling's {lr / base:.3g} x optimizer.lr {base:g}"
    if hogwild_workers is None:
        return f"lower optimizer.lr{f' ({said})' if said else ''} or warm up (scheduler=warmup)"
    p = hogwild_workers
    if lr and isinstance(p, int):
        to = f"optimizer.lr={float(f'{base / p:.3g}'):g}"
        if scaled and by_workers:
            said += f", by the workers; so lr_scaling=none {to}"
        else:
            said += f"{'; so ' if scaled else ': '}{to}"
    elif by_workers:
        said = "with lr_scaling=none: it scaled the lr up by the workers"
    return (
        f"under HogWild the {p} workers' updates all land on the one shared model, about {p} times one worker's "
        f"steps: lower optimizer.lr about {p}-fold{f' ({said})' if said else ''} or optimizer.momentum "
        "(mnist_hogwild's lr 0.01 and momentum 0.5 are experiment=hogwild_lab's)"
    )
