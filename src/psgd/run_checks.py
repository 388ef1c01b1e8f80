"""Checks of a run that need its model built or its data read, made before any worker starts (and before
the first job of a sweep): a setting that cannot work is one line (DataError)."""

from omegaconf import DictConfig
from torch import nn

from psgd.choices import INFO
from psgd.config import compile_mode
from psgd.data import ClassificationData
from psgd.data.datasets import DataError
from psgd.memory import memory_problem


def check_data(cfg: DictConfig, datamodule: ClassificationData, world_size: int) -> str | None:
    """A DataError for a worker that would get no training batch, or a final test of no batch; a warning
    line for a shard smaller than one batch. Needs prepare_data."""
    short = datamodule.check_batches(world_size)
    datamodule.check_test_limit(cfg.trainer.get("limit_test_batches"))
    return short


def check_memory(cfg: DictConfig, net: nn.Module, image_size: int, sizes: list[int], workers: int) -> None:
    """A DataError where `workers` CPU workers on this machine, each training its batches (data.batch_size,
    or its whole shard where that is smaller; `sizes`: the shards), cannot fit in the memory available
    (psgd.memory: a lower bound counted on the meta device, of the eager network: not judged under
    compile, whose graphs may keep fewer tensors). Needs prepare_data for the shard sizes."""
    if compile_mode(cfg.get("compile")):
        return
    batch = min(cfg.data.batch_size, max(sizes))
    shape = (INFO[cfg.data.name].channels, image_size, image_size)
    optimizer = str(cfg.optimizer.get("_target_", "")).rpartition(".")[2]
    asked = f"data.batch_size={cfg.data.batch_size}" + (
        f" (a batch of {batch}: each worker's whole shard)" if batch < cfg.data.batch_size else ""
    )
    hogwild = cfg.strategy.name == "hogwild"  # one copy of the weights in shared memory
    half = "16" in str(cfg.trainer.get("precision"))  # bf16-mixed, 16-mixed, bf16-true ...
    if problem := memory_problem(net, shape, batch, workers, optimizer, asked, shared_weights=hogwild, half=half):
        raise DataError(problem)
