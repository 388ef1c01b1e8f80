"""Learning-rate scaling by worker count and the warm-up schedule, from torch.optim.lr_scheduler parts."""

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, LRScheduler, SequentialLR, StepLR

from psgd.choices import DECAYS, LR_SCALING


def scaled_lr(base_lr: float, workers: int, rule: str = "none") -> float:
    """The base lr for `workers` workers: unchanged, x workers (Goyal et al. 2017) or x sqrt(workers)."""
    if rule == "none":
        return base_lr
    if rule == "linear":
        return base_lr * workers
    if rule == "sqrt":
        return base_lr * math.sqrt(workers)
    raise ValueError(f"lr_scaling={rule!r} is not one of {', '.join(LR_SCALING)}")


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
    if decay not in DECAYS:
        raise ValueError(f"scheduler.decay={decay!r} is not one of {', '.join(DECAYS)}")
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
