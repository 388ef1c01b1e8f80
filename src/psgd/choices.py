"""The names a config chooses from that the modules implementing them share: datasets (image shapes and classes),
partition schemes, models, learning-rate rules, decentralized SGD's graphs. Standard library only: psgd.config
uses them before torch loads.
"""

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class DatasetInfo:
    channels: int
    size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    classes: tuple[str, ...]  # each label's name, as torchvision's dataset class has it

    @property
    def num_classes(self) -> int:
        return len(self.classes)


_DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
_FASHION = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")
_CIFAR10 = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")

INFO = {  # data.name
    "mnist": DatasetInfo(1, 28, (0.1307,), (0.3081,), tuple(f"{i} - {n}" for i, n in enumerate(_DIGITS))),
    "fashion_mnist": DatasetInfo(1, 28, (0.2860,), (0.3530,), _FASHION),
    "cifar10": DatasetInfo(3, 32, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616), _CIFAR10),
}
SCHEMES = ("iid", "sizes", "by_label", "dirichlet")  # data.partition (psgd.data.partition)
# each `model=<name>` choice of conf/model and the class it builds (`model.name` is the run's label)
BUILTIN = {
    "lab_cnn": "psgd.models.LabCNN",
    "mlp": "psgd.models.MLP",
    "singa_cnn": "psgd.models.SingaCNN",
    "wide_resnet": "psgd.models.WideResNet",
}
LR_SCALING = ("none", "linear", "sqrt")  # lr_scaling (psgd.optim)
DECAYS = ("none", "cosine", "step")  # scheduler.decay
COMPRESSIONS = ("none", "fp16", "bf16", "powersgd", "topk", "sign", "qsgd")  # strategy.compression (DDP)
# each compression's own keys (strategy.<key>), with the value null stands for
COMPRESSION_KEYS = {
    "powersgd_rank": ("powersgd", 2),
    "powersgd_start_step": ("powersgd", 10),
    "topk_ratio": ("topk", 0.01),
    "qsgd_levels": ("qsgd", 16),
}


TIME_VARYING = ("one_peer_exponential", "random_matching")  # strategy.topology: graphs that change every round


def torus_shape(workers: int) -> tuple[int, int] | None:
    """The 2-D torus of `workers`: rows x columns, the rows the largest factor up to its square root; None where
    there is none (fewer than 4 workers, or a prime count)."""
    rows = max((d for d in range(2, math.isqrt(workers) + 1) if workers % d == 0), default=None)
    return (rows, workers // rows) if rows else None
