"""Learning-rate scaling by worker count or batch and the warm-up schedule, from torch.optim.lr_scheduler parts."""

import math
from collections.abc import Mapping
from typing import Any

from torch.optim import Optimizer
from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, LRScheduler, SequentialLR, StepLR


def scaled_lr(
    base_lr: float, workers: int, rule: str = "none", samples_per_update: int = 1, reference_batch: int | None = None
) -> float:
    """The lr of a run: `base_lr` unchanged (rule none), or times a ratio (linear, Goyal et al. 2017) or its
    square root (sqrt). The ratio is `workers` when `reference_batch` is None (the workshop's rule), else
    `samples_per_update / reference_batch`: base_lr is then the lr for an update averaging
    `reference_batch` samples, so that a sweep over batch size or worker count needs no retuning."""
    if rule == "none":
        return base_lr
    ratio = workers if reference_batch is None else samples_per_update / reference_batch
    return base_lr * (ratio if rule == "linear" else math.sqrt(ratio))


def schedule_read(settings: Mapping[str, Any] | None) -> dict[str, Any]:
    """The scheduler settings (after config.schedule) that `build_scheduler` and the module read: start_factor
    only with a warm-up, step_size and gamma only with the step decay, interval only where the lr moves.
    A setting left out here makes no difference to the lr, so two runs whose schedule_read agree follow
    the same lr schedule. Settings without an interval (an older checkpoint's) step once per epoch."""
    s = {"interval": "epoch", **{k: v for k, v in (settings or {}).items() if k not in ("name", "restart")}}
    warm, decay = (s.get("warmup_epochs") or 0) > 0, s.get("decay", "none")
    unread = ["start_factor"] * (not warm) + ["step_size", "gamma"] * (decay != "step")
    unread += ["interval"] * (not warm and decay == "none")  # a constant lr
    return {k: v for k, v in s.items() if k not in unread}


def build_scheduler(
    optimizer: Optimizer,
    workers: int,
    max_epochs: int,
    warmup_epochs: int = 0,
    start_factor: float | None = None,
    decay: str = "none",
    step_size: int = 30,
    gamma: float = 0.1,
    steps_per_epoch: int = 1,
) -> LRScheduler | None:
    """Linear warm-up from lr*start_factor (default 1/workers, the workshop's
    LinearLR(start_factor=1/num_gpus)) to lr over `warmup_epochs`, then optional cosine or step decay.
    Lengths are in epochs; the scheduler is stepped `steps_per_epoch` times per epoch: 1 (per epoch), or
    the optimizer steps of an epoch for a schedule that moves after every step (scheduler.interval=step;
    there `warmup_epochs` may be a fraction, e.g. 0.5)."""
    warmup = max(1, round(warmup_epochs * steps_per_epoch)) if warmup_epochs > 0 else 0
    parts: list[LRScheduler] = []
    if warmup > 0:
        factor = start_factor if start_factor is not None else 1.0 / workers
        parts.append(LinearLR(optimizer, start_factor=factor, end_factor=1.0, total_iters=warmup))
    if decay == "cosine":
        parts.append(CosineAnnealingLR(optimizer, T_max=max(1, max_epochs * steps_per_epoch - warmup)))
    elif decay == "step":
        parts.append(StepLR(optimizer, step_size=step_size * steps_per_epoch, gamma=gamma))
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    return SequentialLR(optimizer, parts, milestones=[warmup])
