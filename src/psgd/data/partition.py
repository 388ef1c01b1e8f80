"""Which samples each worker trains on: pure functions of (labels, workers, seed, epoch).

Every worker can compute every worker's shard locally, so shard sizes (and hence the number of
steps each worker will take) are known everywhere without any communication.

Schemes:
- ``iid``: DistributedSampler semantics (a fresh permutation of the whole set each epoch, worker r
  takes positions r, r+W, r+2W, ...), but without padding: shards are disjoint and cover the data.
- ``sizes``: one fraction per worker (``[0.7, 0.3]``); membership fixed by the seed.
- ``by_label``: disjoint label sets spread evenly (2 workers over 10 classes: 0-4 | 5-9).
- ``dirichlet``: label skew; each class is split over workers by proportions ~ Dir(alpha).
For every scheme but ``iid`` the membership is fixed and only the order is reshuffled each epoch.
"""

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from psgd.choices import SCHEMES

# Salts that keep the streams of different uses apart (SeedSequence takes non-negative integers).
MEMBERSHIP, HOLDOUT = 1_000_003, 1_000_033


def generator(*keys: int) -> torch.Generator:
    """A torch generator seeded from several integers, well mixed (no collisions like seed+epoch)."""
    state = np.random.SeedSequence([int(k) for k in keys]).generate_state(2, dtype=np.uint64)
    return torch.Generator().manual_seed(int(state[0] >> np.uint64(1)))


def worker_seed(seed: int, rank: int, epoch: int) -> int:
    """The seed of worker `rank`'s random stream (dropout, augmentation) in `epoch`: a worker process reseeds torch
    with it every epoch (psgd.callbacks.WorkerSetup), a simulated worker's stream starts from it
    (psgd.data.ReplicaLoader), so that a resumed run draws what the uninterrupted one did."""
    return generator(seed, rank, epoch).initial_seed()


def size_boundaries(n: int, fractions: Sequence[float]) -> list[int]:
    """Cut points that split n items by `fractions` (which sum to 1), rounding the cumulative sum."""
    cumulative = np.cumsum([0.0, *fractions])
    cuts = [round(c * n) for c in cumulative]
    cuts[-1] = n
    return cuts


def label_groups(num_classes: int, workers: int) -> list[list[int]]:
    """Disjoint, contiguous label sets of near-equal size, one per worker."""
    if workers > num_classes:
        raise ValueError(f"by_label needs workers <= classes, got {workers} workers for {num_classes} classes")
    return [g.tolist() for g in np.array_split(np.arange(num_classes), workers)]


def partition(
    labels: Tensor,
    workers: int,
    scheme: str = "iid",
    seed: int = 0,
    epoch: int = 0,
    sizes: Sequence[float] | None = None,
    alpha: float | None = None,
    num_classes: int | None = None,
) -> list[Tensor]:
    """One index tensor per worker, in the order that worker visits its samples in `epoch`."""
    n = len(labels)
    if scheme == "iid":  # exactly torch's DistributedSampler(shuffle=True), minus its padding
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))
        return [perm[r::workers] for r in range(workers)]

    if scheme == "sizes":
        if sizes is None or len(sizes) != workers:
            raise ValueError(f"partition 'sizes' needs one fraction per worker ({workers}), got {sizes}")
        perm = torch.randperm(n, generator=generator(seed, MEMBERSHIP))
        cuts = size_boundaries(n, sizes)
        members = [perm[cuts[r] : cuts[r + 1]] for r in range(workers)]
    elif scheme == "by_label":
        classes = num_classes or int(labels.max()) + 1
        members = [torch.nonzero(torch.isin(labels, torch.tensor(g))).flatten() for g in label_groups(classes, workers)]
    elif scheme == "dirichlet":
        if alpha is None or alpha <= 0:
            raise ValueError(f"partition 'dirichlet' needs dirichlet_alpha > 0, got {alpha}")
        members = _dirichlet_members(labels, workers, alpha, seed, num_classes)
    else:
        raise ValueError(f"unknown partition {scheme!r}; allowed: {', '.join(SCHEMES)}")
    return [m[torch.randperm(len(m), generator=generator(seed, epoch, r))] for r, m in enumerate(members)]


def _dirichlet_members(labels: Tensor, workers: int, alpha: float, seed: int, num_classes: int | None) -> list[Tensor]:
    rng = np.random.default_rng([seed, MEMBERSHIP])
    classes = num_classes or int(labels.max()) + 1
    parts: list[list[Tensor]] = [[] for _ in range(workers)]
    for c in range(classes):
        idx = torch.nonzero(labels == c).flatten()
        idx = idx[torch.from_numpy(rng.permutation(len(idx)))]
        cuts = size_boundaries(len(idx), rng.dirichlet([alpha] * workers))
        for r in range(workers):
            parts[r].append(idx[cuts[r] : cuts[r + 1]])
    members = [torch.cat(p).sort().values for p in parts]
    empty = [r for r, m in enumerate(members) if len(m) == 0]
    if empty:
        raise ValueError(
            f"dirichlet_alpha={alpha} left worker(s) {empty} with no samples; use a larger alpha or another seed"
        )
    return members


def num_batches(n: int, batch_size: int, drop_last: bool = False) -> int:
    return n // batch_size if drop_last else math.ceil(n / batch_size)


def limited_batches(batches: int, limit: int | float) -> int:
    """How many of `batches` a Lightning trainer.limit_*_batches lets a loop take, as Lightning counts
    them: a number of batches, or a fraction of them (rounded down)."""
    return min(batches, limit) if isinstance(limit, int) else int(batches * limit)
