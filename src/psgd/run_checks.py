"""Checks of a run that need its model built or its data read, made before any worker starts (and before
the first job of a sweep): a setting that cannot work is one line (DataError)."""

import os
from typing import Any

from omegaconf import DictConfig, OmegaConf
from torch import nn

from psgd import forkserver
from psgd.choices import INFO
from psgd.config import ConfigError, Jobs, compile_mode, resolve_accelerator, resolve_workers
from psgd.config.targets import meta_network
from psgd.console import in_the_job
from psgd.data import ClassificationData
from psgd.data.datasets import DataError, load_split, what_is_missing
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


def build_datamodule(cfg: DictConfig, image_size: int | None = None) -> ClassificationData:
    """The run's datamodule, from its data settings and strategy, its images resized to `image_size`
    (the model's; None: the dataset's own); nothing is read yet (prepare_data)."""
    return ClassificationData(
        **OmegaConf.to_container(cfg.data, resolve=True),
        image_size=image_size,
        seed=cfg.seed,
        channels_last=cfg.channels_last,
        lockstep=cfg.strategy.name == "ddp",  # DDP needs equal steps on every worker; averaging lets each run its own
        # replicas that differ (model averaging) are each evaluated on the whole split
        shard_eval=cfg.strategy.name in ("ddp", "hogwild"),
    )


def sweep_data_problem(jobs: Jobs) -> str | None:
    """Why a dataset of this sweep cannot be read here, or None: the files a job would read are looked
    for once per dataset and folder (CIFAR10's also md5-checked, as each job would), and missing or
    damaged ones are downloaded now (as a single run does before its workers start), not by every job in
    turn. Only for Hydra's basic launcher, whose jobs run on this machine."""
    if not forkserver.runs_jobs_here(jobs[0][1]):
        return None

    def source(cfg: DictConfig) -> tuple[str, str, bool, bool]:
        d = cfg.data
        return d.name, os.path.abspath(os.path.expanduser(str(d.root))), bool(d.download), bool(d.verify_md5)

    sources = [source(cfg) for _, cfg in jobs]
    for first in dict.fromkeys(sources):  # each dataset and folder once
        name, root, download, verify_md5 = first
        if what_is_missing(name, root, verify_md5=verify_md5) is None:  # there: each job reads it
            continue
        try:
            for train in (True, False):
                load_split(name, root, train, download=download, verify_md5=verify_md5)
        except DataError as e:
            if all(other == first for other in sources):
                return f"{e} (no job was started)"
            return in_the_job(e, jobs[sources.index(first)][0], [j for j, _ in jobs])
    return _batches_problem(jobs)


def _batches_problem(jobs: Jobs) -> str | None:
    """What a job finds only with its dataset read, for every job before the first one starts: a worker
    without a training batch (a shard smaller than data.batch_size with data.drop_last=true, a
    dirichlet partition that leaves a worker no sample at the job's seed), a final test of no batch, or
    (on CPU) a batch whose training cannot fit in this machine's memory (check_memory).
    Each dataset and folder is decoded once; each job then deals its shards as it will, with the job's
    own datamodule and check (build_datamodule, check_data). Every job has passed `check`."""
    decoded: dict[tuple[str, str], Any] = {}  # the first datamodule of each dataset and folder
    every_job = [j for j, _ in jobs]
    for job, cfg in jobs:
        try:
            workers = resolve_workers(cfg) * cfg.trainer.num_nodes
            datamodule = build_datamodule(cfg)
            first = decoded.setdefault((datamodule.name, datamodule.root), datamodule)
            if first is datamodule:
                datamodule.prepare_data()
            else:
                datamodule.decoded_from(first)
            check_data(cfg, datamodule, workers)
            if resolve_accelerator(cfg) == "cpu":  # a batch that cannot fit in memory, as the job judges it
                net, size = meta_network(cfg.model, cfg.data.name)
                check_memory(cfg, net, size, datamodule.train_shards(workers)[0], workers)
        except (DataError, ConfigError) as e:
            return in_the_job(e, job, every_job)
        except Exception:  # anything else: left to the job, which reports it as its failure
            continue
    return None
