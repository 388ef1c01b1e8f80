"""A command line's jobs judged before any starts: each job's values (no torch), the settings no job reads
(a warning each), and for a sweep run here each job's machine checks, datasets and batches.
"""

import contextlib
import io
import math
import os
import shutil
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig, OmegaConf

from psgd import forkserver
from psgd.advice import hogwild_workers, scales_by_workers
from psgd.config.rules import CONSTANT_LR, check, check_values, resolve_accelerator, resolve_workers, schedule
from psgd.config.schema import ConfigError, said
from psgd.config.targets import meta_network
from psgd.console import in_the_job, warn
from psgd.overrides import override_key


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


Jobs = list[tuple[list[str], DictConfig]]  # (overrides, config) of each job, as psgd.command_line composes them


def values_problem(jobs: Jobs, name_the_job: bool) -> str | None:
    """Why a job of this command line would stop at its start for a value `check_values` refuses, or
    None: the scripts' check before torch loads, for every job wherever it will run (a value means the
    same on any machine). `name_the_job`: add which job of a sweep it is. With none found, a warning
    for each setting that no job reads (unread_settings)."""
    problem = _first_problem(jobs, check_values, name_the_job)
    if problem is None:
        for line in unread_settings(jobs):
            warn(line)
    return problem


# settings read only when another one has a certain value: (setting, the other one (or a tuple of others),
# whether a value of it (of each) reads the setting, the words for those values). A setting is warned about
# by its first row that finds no job reading it.
READ_ONLY_WHEN: tuple[tuple[str, str | tuple[str, ...], Callable[..., bool], str], ...] = (
    ("data.partition_sizes", "data.partition", lambda v: v == "sizes", "data.partition=sizes"),
    ("data.dirichlet_alpha", "data.partition", lambda v: v == "dirichlet", "data.partition=dirichlet"),
    *(  # first: with scheduler=none no scheduler setting is read, whatever the others say
        (
            f"scheduler.{key}",
            "scheduler.name",
            lambda v: v != "none",
            "a schedule (scheduler=warmup or cosine): scheduler=none keeps optimizer.lr constant",
        )
        for key in (*CONSTANT_LR, "start_factor", "step_size", "gamma")
    ),
    (
        "scheduler.start_factor",
        "scheduler.warmup_epochs",
        lambda v: _is_number(v) and v > 0,
        "a warm-up (scheduler=warmup, scheduler.warmup_epochs > 0)",
    ),
    *(
        (f"scheduler.{key}", "scheduler.decay", lambda v: v == "step", "scheduler.decay=step (x gamma every step_size)")
        for key in ("step_size", "gamma")
    ),
    (  # under scheduler=warmup or cosine, their keys can make a constant lr too
        "scheduler.interval",
        ("scheduler.warmup_epochs", "scheduler.decay"),
        lambda warmup, decay: (_is_number(warmup) and warmup > 0) or decay != "none",
        "a warm-up or a decay: a constant lr has no steps to count",
    ),
    (
        "early_stop.patience",
        "early_stop.target_acc",
        lambda v: v is not None,
        "early_stop.target_acc=<an accuracy>, whose validations in a row it counts",
    ),
    (
        "lr_reference_batch",
        "lr_scaling",
        lambda v: v != "none",
        "lr_scaling=linear or sqrt, which scale optimizer.lr by the samples per update / lr_reference_batch",
    ),
)


# settings that act only between worker processes, of one strategy or (None) any: with one worker (under DDP,
# one that strategy.ddp_for_one_worker does not wrap) nothing reads them. (setting, its strategy, why not, a
# value that is one worker's anyway: given, it is no mistake)
BETWEEN_WORKERS: tuple[tuple[str, str | None, str, object], ...] = (
    ("strategy.period", "model_averaging", "one worker has no other replica to average with", None),
    ("strategy.average_buffers", "model_averaging", "one worker has no other replica to average with", None),
    ("strategy.average_optimizer_state", "model_averaging", "one worker has no other replica to average with", None),
    ("strategy.lock", "hogwild", "one worker has no other worker's updates to take turns with", None),
    ("strategy.find_unused_parameters", "ddp", "one worker alone trains without DDP", None),
    ("strategy.bucket_cap_mb", "ddp", "one worker alone trains without DDP", None),
    # label skew and shard sizes need shards to tell apart (iid, the default, is one worker's whole set too)
    ("data.partition", None, "one worker's shard is the whole training set: no label skew, only another order", "iid"),
)


def _processes(cfg: DictConfig) -> tuple[str, int, bool]:
    """The strategy, its worker processes in all, and whether DDP wraps one worker alone (check_values has
    passed)."""
    world = resolve_workers(cfg) * cfg.trainer.get("num_nodes", 1)
    return cfg.strategy.name, world, bool(cfg.strategy.get("ddp_for_one_worker", False))


def _given(jobs: Jobs, key: str, chooser: Callable[[DictConfig], Any]) -> list[tuple[Any, Any]]:
    """(value, chooser(cfg)) of each job whose command line gives `key` a value (not null)."""
    given = [(OmegaConf.select(cfg, key), chooser(cfg)) for job, cfg in jobs if key in {override_key(t) for t in job}]
    return [(value, chosen) for value, chosen in given if value is not None]


def _one_workers_factors(jobs: Jobs) -> list[str]:
    """The lr factors that default to the worker count, chosen for runs of one worker: a warm-up from
    lr x start_factor, null = 1/workers, is a constant lr there, and lr_scaling without lr_reference_batch
    multiplies the lr by the workers, 1. Said when no job of the command line gets a factor other than 1."""

    def named(job: list[str], *keys: str) -> bool:
        return any(override_key(text) in keys for text in job)

    def warmup_factor(cfg: DictConfig) -> float | None:  # None: no warm-up
        sch = schedule(cfg.scheduler)
        if not (_is_number(sch["warmup_epochs"]) and sch["warmup_epochs"] > 0):
            return None
        return sch["start_factor"] if sch["start_factor"] is not None else 1 / _processes(cfg)[1]

    def flat(cfg: DictConfig) -> bool:  # the default start, 1/workers, of one worker: a start factor of 1
        return warmup_factor(cfg) == 1 and cfg.scheduler.get("start_factor") is None

    lines = []
    flats = [cfg for job, cfg in jobs if named(job, "scheduler", "scheduler.warmup_epochs") and flat(cfg)]
    if flats and not any(warmup_factor(cfg) not in (None, 1) for _, cfg in jobs):
        sch = flats[0].scheduler
        lines.append(
            f"the warm-up (scheduler={sch.name}, scheduler.warmup_epochs={sch.warmup_epochs}) has no effect with "
            "workers=1: it starts at optimizer.lr x scheduler.start_factor, and start_factor=null is 1/workers = 1, "
            "so the lr is constant through it; set scheduler.start_factor (e.g. 0.1) to warm one worker up"
        )
    scaled = [cfg for job, cfg in jobs if named(job, "lr_scaling") and cfg.lr_scaling != "none"]
    scaling = [cfg for _, cfg in jobs if cfg.lr_scaling != "none"]
    if scaled and all(scales_by_workers(cfg) and _processes(cfg)[1] == 1 for cfg in scaling):
        lines.append(
            f"lr_scaling={scaled[0].lr_scaling} has no effect with workers=1: with lr_reference_batch=null it "
            "scales optimizer.lr by the workers, 1 here; lr_reference_batch=<samples> scales it by the samples per "
            "update instead"
        )
    return lines


def _hogwild_scaled_by_workers(jobs: Jobs) -> list[str]:
    """lr_scaling by the worker count (lr_reference_batch=null) under HogWild: its P workers' updates all
    land on the one model, about P times one worker's step already, and the lr P times larger on top.
    Said once, for the job with the most workers; lr_reference_batch scales by an update's samples instead."""
    hogwild = [
        (n, cfg)
        for _, cfg in jobs
        if (n := hogwild_workers(cfg.strategy.name, _processes(cfg)[1])) and scales_by_workers(cfg)
    ]
    if not hogwild:
        return []
    n, cfg = max(hogwild, key=lambda job: job[0])
    lr = cfg.optimizer.lr * (n if cfg.lr_scaling == "linear" else math.sqrt(n))  # psgd.optim.scaled_lr's
    return [
        f"lr_scaling={cfg.lr_scaling} scales optimizer.lr by the workers under strategy=hogwild too (workers={n}: lr "
        f"{lr:g}), whose workers' updates already all land on the one shared model, about {n} times one worker's "
        "step: lr_scaling=none, or lr_reference_batch=<samples>, which scales by an update's samples (one worker's "
        "batch under HogWild)"
    ]


def unread_settings(jobs: Jobs) -> list[str]:
    """A warning line for each setting the command line gives a value that no job of it reads (e.g.
    data.partition_sizes without data.partition=sizes). A setting that some job of a sweep reads is not
    warned about for the others, nor one a preset sets (a preset's sweep may read it in other jobs)."""
    lines, warned = [], set()
    for key, other, reads, wording in READ_ONLY_WHEN:
        others = (other,) if isinstance(other, str) else other
        given = _given(jobs, key, lambda cfg, others=others: [OmegaConf.select(cfg, o) for o in others])
        if key not in warned and given and not any(reads(*chosen) for _, chosen in given):
            choosers = " ".join(  # as typed; scheduler.name: the preset chosen, as the command line says it
                f"{o.removesuffix('.name')}={','.join(dict.fromkeys(said(c[i]) for _, c in given))}"
                for i, o in enumerate(others)
            )
            lines.append(f"{key}={said(given[0][0])} has no effect with {choosers}: it is read with {wording}")
            warned.add(key)
    for key, owner, why, as_one in BETWEEN_WORKERS:
        given = [(value, run) for value, run in _given(jobs, key, _processes) if value != as_one]
        ours = [owner in (None, name) for _, (name, _, _) in given]  # the job's strategy has the setting
        if given and not any(mine and (n > 1 or (owner and alone)) for mine, (_, (_, n, alone)) in zip(ours, given)):
            choosers = ", ".join(
                dict.fromkeys(
                    f"workers={n}" if mine else f"strategy={name}" for mine, (_, (name, n, _)) in zip(ours, given)
                )
            )
            by = f" by strategy={owner}" if owner else ""
            wrapped = " or strategy.ddp_for_one_worker=true" if owner == "ddp" else ""
            lines.append(
                f"{key}={said(given[0][0])} has no effect with {choosers}: it is read{by} with more than one "
                f"worker{wrapped}{f' ({why})' if all(ours) else ''}"
            )
    lines += _one_workers_factors(jobs)
    lines += _hogwild_scaled_by_workers(jobs)
    # worse than no effect: samples held out for a validation that never runs are not trained on either
    held = [value for value, _ in _given(jobs, "data.val_split", lambda cfg: None)]
    validated = [OmegaConf.select(cfg, "trainer.limit_val_batches") != 0 for _, cfg in jobs]
    if any(_is_number(v) and v > 0 for v in held) and not any(validated):
        lines.append(
            f"data.val_split={held[0]} holds out training samples for validation, and trainer.limit_val_batches=0 "
            "runs none: they are neither trained nor validated on; data.val_split=0 trains on them"
        )
    return lines


def sweep_values_problem(jobs: Jobs) -> str | None:
    """Why a job of this sweep would stop at its start, for every job before the first one starts:
    `check` of each composed job, as the job itself will run it, or None. Only for Hydra's basic
    launcher, which runs the jobs here: jobs that run elsewhere (submitit on SLURM) see their own GPUs
    and environment and are checked there (where SLURM is: without it, submitit fails with a traceback).
    `jobs`: the first with Hydra's node."""
    launcher = str(OmegaConf.select(jobs[0][1], "hydra.launcher._target_", default=""))
    if launcher.endswith(".SlurmLauncher") and shutil.which("srun") is None:  # what submitit looks for
        choice = OmegaConf.select(jobs[0][1], "hydra.runtime.choices", default={}).get("hydra/launcher")
        return (
            f"hydra/launcher={choice or 'submitit_slurm'} submits each job to SLURM, and this machine has no "
            "srun on its PATH: run the sweep on a SLURM login node, or leave hydra/launcher out to run the "
            "jobs here"
        )
    if not forkserver.runs_jobs_here(jobs[0][1]):
        return None
    return _first_problem(jobs, check, name_the_job=True)


def sweep_data_problem(jobs: Jobs) -> str | None:
    """Why a dataset of this sweep cannot be read here, or None: the files a job would read are looked
    for once per dataset and folder (CIFAR10's also md5-checked, as each job would), and missing or
    damaged ones are downloaded now (as a single run does before its workers start), not by every job in
    turn. Only for Hydra's basic launcher, whose jobs run on this machine."""
    from psgd.data.datasets import DataError, load_split, what_is_missing

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
    (on CPU) a batch whose training cannot fit in this machine's memory (run.check_memory).
    Each dataset and folder is decoded once; each job then deals its shards as it will, with the job's
    own datamodule and check (run.build_datamodule, run.check_data). Every job has passed `check`."""
    from psgd.data.datasets import DataError
    from psgd.run import build_datamodule
    from psgd.run_checks import check_data, check_memory

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


def _first_problem(jobs: Jobs, judge: Callable[[DictConfig], object], name_the_job: bool) -> str | None:
    for job, cfg in jobs:
        try:
            with contextlib.redirect_stderr(io.StringIO()):  # a warning: each job prints its own as it starts
                judge(cfg)
        except ConfigError as e:
            return in_the_job(e, job, [j for j, _ in jobs]) if name_the_job else str(e)
        except Exception:  # anything else: left to the job, which reports it as its failure
            continue
    return None
