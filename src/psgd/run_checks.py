"""Checks of a run that need its model built or its data read, made before any worker starts: a setting that
cannot work is one line (DataError), and one that would do nothing is warned about."""

import os
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch import nn

from psgd import forkserver
from psgd.choices import INFO
from psgd.config import ConfigError, Jobs, compile_mode, resolve_accelerator, resolve_workers
from psgd.config.targets import meta_network
from psgd.console import in_the_job, warn
from psgd.data import ClassificationData
from psgd.data.datasets import DataError, load_split, what_is_missing
from psgd.memory import memory_problem
from psgd.strategies.model_averaging import common_steps, optimizer_state_tensors


def check_data(cfg: DictConfig, datamodule: ClassificationData, world_size: int) -> str | None:
    """What can only be judged with the dataset read (prepare_data): a DataError for a worker that would
    get no training batch, or a final test of no batch; a warning line for a shard smaller than one batch."""
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


def warn_if_nothing_to_average(cfg: DictConfig, net: nn.Module, world_size: int) -> None:
    """Model averaging's switches that find nothing to act on, so that a sweep over them compares identical
    runs: strategy.average_buffers=false on a model without floating buffers (the lab CNN without batch
    norm), strategy.average_optimizer_state=true with an optimizer that keeps no state (SGD without
    momentum). (With one worker the command line's check has said that nothing is averaged at all.)"""
    s = cfg.strategy
    if s.name != "model_averaging" or world_size == 1:
        return
    if s.average_buffers is False and not any(b.is_floating_point() for b in net.buffers()):
        adds = "; model.batch_norm=true adds them" if "batch_norm" in cfg.model else ""
        warn(
            f"strategy.average_buffers=false has no effect with model={cfg.model.name}: the model has no floating "
            f"buffers to average (BatchNorm's running statistics{adds})"
        )
    if s.average_optimizer_state is True:
        weight = nn.Parameter(torch.zeros(1))
        weight.grad = torch.ones(1)
        try:  # an optimizer of the user's that takes no such parameter is not judged here
            optimizer = instantiate(cfg.optimizer, _convert_="all")([weight], lr=1e-3)
            optimizer.step()  # its state, as after a training step
        except Exception:
            return
        if not optimizer_state_tensors(optimizer):
            momentum = f" and optimizer.momentum={cfg.optimizer.momentum}" if "momentum" in cfg.optimizer else ""
            warn(
                f"strategy.average_optimizer_state=true has no effect with {type(optimizer).__name__}{momentum}: it "
                "keeps no state to average (SGD keeps its momentum, with optimizer.momentum > 0)"
            )


def warn_if_period_never_comes(cfg: DictConfig, batches: list[int], accumulate: int) -> None:
    """Model averaging with a strategy.period longer than the steps every worker takes in the whole
    run (`batches`: each worker's per epoch; `accumulate` of them per optimizer step): no periodic
    averaging happens, the run is one-shot averaging (strategy.period=null), and a sweep over periods
    compared identical runs without a word."""
    s, t = cfg.strategy, cfg.trainer
    if s.name != "model_averaging" or not s.period or len(batches) == 1 or t.get("fast_dev_run"):
        return
    if t.max_epochs in (-1, None) or t.get("overfit_batches"):
        return  # training's length is not known ahead (early stopping ends it), or Lightning's own
    per_epoch = common_steps(batches, t.get("limit_train_batches"), accumulate)
    steps = per_epoch * t.max_epochs
    if s.period > steps:
        warn(
            f"strategy.period={s.period} never comes: it counts the optimizer steps every worker takes, "
            f"{per_epoch} per epoch and {steps} in trainer.max_epochs={t.max_epochs}, so the replicas are "
            f"averaged only at the end, as with strategy.period=null; use strategy.period<={steps} to also "
            "average during training"
        )


def warn_if_an_epoch_holds_less_than_an_update(cfg: DictConfig, batches: list[int], accumulate: int) -> None:
    """Each worker accumulates `accumulate` batches per update, but a worker's epoch holds fewer
    (`batches`: each worker's per epoch): Lightning steps at every epoch's end, so that worker's updates
    never hold what was asked, while metrics.json's parallel_batches and lr_scaling's lr count it."""
    t = cfg.trainer
    if accumulate == 1 or t.get("fast_dev_run") or t.get("overfit_batches"):
        return
    fewest = common_steps(batches, t.get("limit_train_batches"), 1)
    if fewest >= accumulate:
        return
    world_size = len(batches)
    k = cfg.get("parallel_batches")
    given, most = (
        (f"parallel_batches={k}", f"parallel_batches<={fewest * world_size}")
        if k is not None
        else (f"trainer.accumulate_grad_batches={accumulate}", f"trainer.accumulate_grad_batches<={fewest}")
    )
    # DDP's workers all take the fewest batches any shard holds (lockstep); the others their own shard's
    every = cfg.strategy.name == "ddp" or len(set(batches)) == 1
    whose, which = (
        ("each worker's epoch", "every update holds") if every else ("the smallest shard's epoch", "its updates hold")
    )
    plural = "batch" if fewest == 1 else "batches"
    warn(
        f"{given} accumulates {accumulate} batches per worker and update, but {whose} holds {fewest} {plural} and "
        f"Lightning steps at each epoch's end: {which} {fewest} at most; use {most}"
    )


def warn_if_lockstep_leaves_samples_out(cfg: DictConfig, sizes: list[int], batches: list[int]) -> None:
    """DDP's workers all take the batches of the smallest shard (lockstep): with uneven shards
    (`sizes` samples in `batches` batches per worker) the larger ones' further samples are left out
    of every epoch, which only the history's sample counts showed. Said from 1 % of the samples on."""
    t, d = cfg.trainer, cfg.data
    if cfg.strategy.name != "ddp" or len(sizes) == 1 or t.get("fast_dev_run") or t.get("overfit_batches"):
        return
    limit = t.get("limit_train_batches")
    if limit is not None and not (isinstance(limit, float) and limit == 1.0):  # an int 1 is one batch
        return  # shorter epochs asked for: what is left out is the user's choice
    steps = min(batches)

    def trained(counts: list[int]) -> int:
        return sum(min(n, c * d.batch_size) for n, c in zip(sizes, counts))

    left_out = trained(batches) - trained([steps] * len(sizes))  # drop_last's partial batches are not counted
    total = sum(sizes)
    if left_out >= total / 100:  # not a few samples of a last partial batch (by_label's classes differ a little)
        warn(
            f"data.partition={d.partition} under strategy=ddp: every worker takes the {steps} "
            f"step{'' if steps == 1 else 's'} per epoch the "
            f"smallest shard gives (DDP's lockstep), so {left_out} of the {total} training samples "
            f"({100 * left_out / total:.0f} %) are left out of each epoch, other ones each epoch; "
            "strategy=model_averaging or strategy=hogwild train every shard whole"
        )


def build_datamodule(cfg: DictConfig, image_size: int | None = None) -> ClassificationData:
    """The run's datamodule, from its data settings and strategy, its images resized to `image_size`
    (the model's; None: the dataset's own); nothing is read yet (prepare_data)."""
    return ClassificationData(
        **OmegaConf.to_container(cfg.data, resolve=True),
        image_size=image_size,
        seed=cfg.seed,
        channels_last=cfg.channels_last,
        record_shards=cfg.record_shards,
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
