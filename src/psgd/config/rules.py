"""The checks a key's own schema cannot make, each problem one ConfigError line: rules that join keys where a
run would crash or hang (`check_values`: no torch, the scripts run it before it loads), at the start of every
job what depends on the machine: accelerator, launcher, the classes and checkpoints named (`check`), and a
command line's jobs judged before any starts (`values_problem`, `sweep_values_problem`).
"""

import contextlib
import io
import math
import os
import shutil
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from psgd import forkserver
from psgd.choices import COMPRESSION_KEYS, INFO
from psgd.config.schema import problem
from psgd.config.targets import check_targets
from psgd.console import in_the_job
from psgd.environment import cpu_count
from psgd.errors import ConfigError

Jobs = list[tuple[list[str], DictConfig]]  # (overrides, config) of each job, as psgd.command_line composes them

# what to give instead, said by a line for a ckpt_path or init_weights that names no checkpoint
GIVE = {
    "ckpt_path": "give a .ckpt file or a run dir",
    "init_weights": "give a run dir, a .ckpt file or a weights file such as weights/rank0.pt",
}


@dataclass(frozen=True)
class Plan:
    """What the config resolves to on this machine."""

    workers: int  # per node
    threads_per_worker: int
    accelerator: str  # cpu or gpu
    accumulate_grad_batches: int = 1  # micro-batches each worker accumulates per update
    launcher: str = "psgd"  # who starts the worker processes: psgd, or torchrun / srun (one per worker)
    start_method: str = "spawn"  # how psgd's launcher starts them (strategy.start_method, resolved)


def compile_mode(value: Any) -> str | None:
    """The torch.compile mode the `compile` setting asks for, or None (not compiled)."""
    return "default" if value is True else (value or None)


def schedule(scheduler: Mapping[str, Any]) -> dict[str, Any]:
    """The lr schedule a run trains with: its scheduler settings, but a constant lr for scheduler=none
    (whatever its other keys say: a sweep over schedules gives them to every job)."""
    settings = dict(scheduler)
    if settings.get("name") == "none":
        settings.update(warmup_epochs=0, decay="none", interval="epoch")
    return settings


def resolve_workers(cfg: DictConfig) -> int:
    """`workers` is the knob; `trainer.devices` follows it unless set (then it wins if workers is 1)."""
    workers, devices = cfg.workers, cfg.trainer.get("devices")
    if devices is None:
        return workers
    if workers not in (1, devices):
        raise ConfigError(f"workers={workers} and trainer.devices={devices} disagree: set only one of them")
    return devices


def resolve_accumulation(cfg: DictConfig, world_size: int) -> int:
    """The micro-batches each worker accumulates per update: trainer.accumulate_grad_batches, or where set
    `parallel_batches` K spread over the workers."""
    k = cfg.get("parallel_batches")
    if k is None:
        return cfg.trainer.get("accumulate_grad_batches") or 1
    if k % world_size:
        raise ConfigError(
            f"parallel_batches={k} is invalid with {world_size} workers: it must be a multiple of the workers "
            f"(each accumulates parallel_batches / workers micro-batches), e.g. {world_size * max(1, k // world_size)}"
        )
    return k // world_size


def _partition(d: DictConfig, workers: int) -> None:
    """What data.partition needs of the workers and of its own keys."""
    sizes = None if d.partition_sizes is None else list(d.partition_sizes)
    fits = sizes is not None and len(sizes) == workers and math.isclose(sum(sizes), 1.0, abs_tol=1e-6)
    if d.partition == "sizes" and not fits:
        raise ConfigError(
            f"data.partition_sizes={'null' if sizes is None else sizes} is invalid: data.partition=sizes needs one "
            f"fraction per worker ({workers}), which must sum to 1"
        )
    classes = INFO[d.name].num_classes
    if d.partition == "by_label" and workers > classes:
        raise ConfigError(
            f"data.partition='by_label' is invalid: {workers} workers but data={d.name} has only {classes} classes: "
            f"use at most {classes} workers"
        )
    if d.partition == "dirichlet" and d.dirichlet_alpha is None:
        raise ConfigError(
            "data.dirichlet_alpha=null is invalid: data.partition=dirichlet needs a number > 0 (the label skew: "
            "smaller = more skewed, e.g. 0.5)"
        )


def _own_pace(cfg: DictConfig, world: int) -> None:
    """Several workers of model averaging or HogWild each take their own number of steps (their own shard):
    what every worker must join inside an epoch (a validation, Lightning's stop for max_time or max_steps)
    would leave the others waiting at a collective until strategy.timeout_s."""
    name, t = cfg.strategy.name, cfg.trainer
    if world == 1 or name == "ddp":
        return
    vci = t.get("val_check_interval")
    asked = {  # 1.0 (a float) is once per epoch, at its end; an int is a number of batches
        "val_check_interval": vci is not None and not (isinstance(vci, float) and vci == 1.0),
        "max_time": t.get("max_time") is not None,
        "max_steps": t.get("max_steps") not in (None, -1),
    }
    if key := next((key for key, given in asked.items() if given), None):
        raise ConfigError(
            f"trainer.{key}={t[key]} is invalid with strategy={name} and {world} workers: each worker takes its own "
            "number of steps and the others would wait for it; use trainer.max_epochs (and limit_train_batches), or "
            "strategy=ddp"
        )


# model averaging's schedule keys beside `period`, with their unset values
AVERAGING_SCHEDULE = {"sync_steps": 0, "outer_optimizer": None, "group_periods": None}


def _strategy_keys(s: DictConfig) -> None:
    """A compression key counts only for DDP, and only for its own compression; model averaging's schedule keys
    (AVERAGING_SCHEDULE) only for it: one set elsewhere is refused."""
    keys = {key: s.get(key) for key in ("compression", *COMPRESSION_KEYS) if s.get(key) is not None}
    if s.name != "ddp" and keys and keys != {"compression": "none"}:
        key = next(iter(keys))
        raise ConfigError(
            f"strategy.{key}={keys[key]} is invalid with strategy={s.name}: gradient compression is DDP's "
            "(model averaging and HogWild exchange no gradients); use strategy=ddp or leave it out"
        )
    for key, unset in AVERAGING_SCHEDULE.items():
        if s.name != "model_averaging" and s.get(key, unset) != unset:
            raise ConfigError(
                f"strategy.{key}={s[key]} is invalid with strategy={s.name}: it is model averaging's; use "
                "strategy=model_averaging (or strategy=diloco) or leave it out"
            )
    for key, (owner, _) in COMPRESSION_KEYS.items():
        if key in keys and s.get("compression") != owner:
            raise ConfigError(
                f"strategy.{key}={keys[key]} is invalid with strategy.compression={s.get('compression')}: it is "
                f"compression={owner}'s; use strategy.compression={owner} or leave it out"
            )


def _groups(s: DictConfig, world: int) -> None:
    """Hierarchical averaging's groups: sizes that nest (each divides the next), the largest all workers, and no
    other schedule beside them (period, sync_steps, an outer optimizer)."""
    periods = s.get("group_periods")
    if periods is None:
        return
    sizes = sorted(periods)
    shown = "{" + ", ".join(f"{k}: {v}" for k, v in periods.items()) + "}"
    if sizes[-1] != world or any(b % a for a, b in zip(sizes, sizes[1:])):
        raise ConfigError(
            f"strategy.group_periods={shown} is invalid with {world} workers: group sizes must nest (each divides "
            f"the next) and the largest must be all {world} workers, e.g. {{{max(1, world // 2)}: 4, {world}: 16}}"
        )
    others = {"period": None, **AVERAGING_SCHEDULE}
    other = next((k for k, unset in others.items() if k != "group_periods" and s.get(k, unset) != unset), None)
    if other:
        raise ConfigError(
            f"strategy.{other}={s[other]} is invalid with strategy.group_periods: the groups' periods are the "
            "schedule; leave it out"
        )


def _stragglers(st: DictConfig, world: int) -> None:
    """stragglers.slowdown names every worker's factor: one per worker of all nodes."""
    slowdown = st.get("slowdown")
    if slowdown is not None and len(slowdown) != world:
        example = ", ".join(["1"] * (world - 1) + ["3"])
        raise ConfigError(
            f"stragglers.slowdown={list(slowdown)} is invalid with {world} workers: it takes one factor per worker "
            f"({world}), e.g. [{example}] for the last one three times slower; or null for none"
        )


def _shared_queue(cfg: DictConfig) -> None:
    """HogWild's shared queue leaves each worker's steps per epoch to its speed: no lr schedule by steps, and no
    fraction of an epoch's batches (a number of them caps each worker's)."""
    if not (cfg.strategy.get("shared_queue") and cfg.strategy.name == "hogwild"):
        return
    unknown = "each worker takes as many of the epoch's batches as its speed allows, so its steps per epoch are unknown"
    if schedule(cfg.scheduler).get("interval") == "step":
        raise ConfigError(
            f"scheduler.interval=step is invalid with strategy.shared_queue=true: {unknown}; use "
            "scheduler.interval=epoch"
        )
    limit = cfg.trainer.get("limit_train_batches")
    if isinstance(limit, float) and limit != 1.0:
        raise ConfigError(
            f"trainer.limit_train_batches={limit} is invalid with strategy.shared_queue=true: {unknown}, and a "
            "fraction of them is none; give a number of batches (each worker's most), e.g. "
            "trainer.limit_train_batches=100"
        )


def check_values(cfg: DictConfig) -> int:
    """Every value the config alone decides (no torch, no machine): the schema, then the rules that join
    keys. Returns the workers per node; raises ConfigError."""
    if line := problem(cfg):
        raise ConfigError(line)
    workers, epochs = resolve_workers(cfg), cfg.trainer.max_epochs
    warmup = schedule(cfg.scheduler)["warmup_epochs"]
    if warmup > epochs and not cfg.trainer.get("fast_dev_run"):  # the lr would never reach optimizer.lr
        raise ConfigError(
            f"scheduler.warmup_epochs={warmup} is invalid with trainer.max_epochs={epochs}: the warm-up would not "
            f"end before training does; use warmup_epochs<={epochs}"
        )
    _strategy_keys(cfg.strategy)
    world = workers * cfg.trainer.num_nodes  # the workers of every node
    _groups(cfg.strategy, world)
    alpha = cfg.strategy.get("alpha")
    if cfg.strategy.name == "elastic_averaging" and alpha is not None and alpha > 1 / world:
        raise ConfigError(
            f"strategy.alpha={alpha} is invalid with {world} workers: the elastic pull must be in (0, 1/workers] "
            f"= (0, {1 / world:.4g}] (the centre moves workers x alpha of the way); or null for 0.9 / workers"
        )
    _own_pace(cfg, world)
    _stragglers(cfg.stragglers, world)
    _shared_queue(cfg)
    _partition(cfg.data, workers)
    resolve_accumulation(cfg, world)
    return workers


def checkpoint_file(setting: str, value: str) -> Path:
    """The file a `setting` (ckpt_path, init_weights) names: a file, or a run dir's checkpoints/last.ckpt (the
    run dir or that folder given); a sweep's dir, or no torch.save file there, is a ConfigError ending with
    what to give instead (GIVE)."""
    path = Path(value).expanduser()
    if (path / "multirun.yaml").is_file():  # a sweep's dir: its jobs are the runs
        jobs = sorted((c.parents[1] for c in path.glob("*/checkpoints/last.ckpt")), key=lambda d: (len(d.name), d))
        example = f", e.g. {jobs[0]}" if jobs else ""
        raise ConfigError(f"{setting}={value!r} is a sweep's dir: give one job's run dir{example}")
    if path.is_dir():
        path = path / "last.ckpt" if (path / "last.ckpt").is_file() else path / "checkpoints" / "last.ckpt"
    if not path.is_file():
        raise ConfigError(f"{setting}={value!r} is invalid: no checkpoint at {path} ({GIVE[setting]})")
    if not zipfile.is_zipfile(path):  # torch.save's format (Lightning's checkpoints too)
        raise ConfigError(f"{setting}={value!r} is not a checkpoint file ({GIVE[setting]})")
    return path


def resolve_accelerator(cfg: DictConfig) -> str:
    """cpu or gpu: trainer.accelerator, with auto and cuda resolved on this machine."""
    import torch

    accelerator = cfg.trainer.get("accelerator", "auto")
    if accelerator == "auto":
        return "gpu" if torch.cuda.is_available() else "cpu"
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ConfigError(f"trainer.accelerator={accelerator!r} is invalid: no CUDA device is visible; use cpu or auto")
    return "gpu" if accelerator == "cuda" else accelerator


def resolve_start_method(s: DictConfig, accelerator: str) -> str:
    """strategy.start_method, or for null psgd's choice: forkserver for HogWild and on CPU (psgd's fork server
    starts workers already loaded), spawn on GPU (a process that has used CUDA cannot fork workers that use it)."""
    method = s.get("start_method")
    if method is None:
        cpu = accelerator == "cpu" and forkserver.available()
        method = "forkserver" if s.name == "hogwild" or cpu else "spawn"
    if method == "forkserver" and accelerator != "cpu":
        raise ConfigError(
            f"strategy.start_method={method} is invalid on GPU: CUDA cannot be used in forked workers; "
            "use spawn, or null for the default"
        )
    return method


def launcher(cfg: DictConfig, workers: int) -> str:
    """Who starts the workers: torchrun or srun (as Lightning's cluster environments detect them in the Trainer),
    whose process counts must be the config's, or psgd on this machine."""
    from lightning_fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

    nodes, tasks = cfg.trainer.num_nodes, int(os.environ.get("SLURM_NTASKS", "1"))
    if TorchElasticEnvironment.detect():
        name = "torchrun"
    elif SLURMEnvironment.detect() and SLURMEnvironment.job_name() not in ("bash", "interactive") and tasks > 1:
        name = "srun"
    elif nodes > 1:  # nobody would start the other nodes' workers
        raise ConfigError(
            f"trainer.num_nodes={nodes} needs a launcher that starts the workers on every node (torchrun "
            f"--nnodes {nodes} ... train.py, or srun --nodes {nodes} ...; see the README's Scaling out): "
            "psgd starts workers on this machine only; use trainer.num_nodes=1 here"
        )
    else:
        return "psgd"
    if cfg.strategy.name == "hogwild":
        raise ConfigError(
            f"strategy=hogwild is invalid under {name}: its workers must be started by psgd to share one "
            "model in memory; run `python train.py strategy=hogwild workers=N` on one machine instead"
        )
    if name == "srun" and tasks != workers * nodes:
        raise ConfigError(
            f"SLURM started SLURM_NTASKS={tasks} tasks but workers x trainer.num_nodes = {workers * nodes}: "
            "set workers to the tasks per node and trainer.num_nodes to the nodes (srun --ntasks-per-node)"
        )
    if name == "torchrun":
        local, world = int(os.environ["LOCAL_WORLD_SIZE"]), int(os.environ["WORLD_SIZE"])
        if (workers, workers * nodes) != (local, world):
            raise ConfigError(
                f"workers={workers} trainer.num_nodes={nodes} do not match torchrun's {local} processes per "
                f"node and {world} in all: use workers={local} trainer.num_nodes={world // max(local, 1)}"
            )
    return name


def check(cfg: DictConfig) -> Plan:
    """Validate every value here on this machine (check_values, then the accelerator, the classes the config
    names, the checkpoints it reads and the launcher); returns the resolved plan or raises ConfigError."""
    workers = check_values(cfg)
    accelerator = resolve_accelerator(cfg)
    if cfg.strategy.name == "hogwild" and accelerator != "cpu":
        raise ConfigError(
            "strategy=hogwild is invalid on GPU: its workers share one model in CPU shared memory; "
            "use trainer.accelerator=cpu (or strategy=ddp / model_averaging on GPU)"
        )
    check_targets(cfg)
    for setting in GIVE:  # here, not in check_values: a file is there on one machine and not on another
        if cfg.get(setting) is not None:
            checkpoint_file(setting, cfg[setting])
    started_by = launcher(cfg, workers)
    if started_by == "psgd" and accelerator == "gpu":
        check_gpu_count(workers, "workers" if cfg.trainer.get("devices") is None else "trainer.devices")
    return Plan(
        workers=workers,
        threads_per_worker=cfg.threads_per_worker or max(1, cpu_count() // workers),
        accelerator=accelerator,
        accumulate_grad_batches=resolve_accumulation(cfg, workers * cfg.trainer.num_nodes),
        launcher=started_by,
        start_method=resolve_start_method(cfg.strategy, accelerator),
    )


def check_gpu_count(workers: int, key: str) -> None:
    """Each worker psgd starts on GPU needs a CUDA device of its own (Lightning refuses more devices than it
    sees with a traceback, NCCL two ranks on one device). torchrun and srun place their own workers: a task
    there may see only its own device, so their workers are not counted here."""
    import torch

    gpus = torch.cuda.device_count()
    if workers > gpus:
        raise ConfigError(
            f"{key}={workers} is invalid on GPU: {gpus} CUDA device{'' if gpus == 1 else 's'} visible and each "
            f"worker needs its own; use {key}<={gpus}, or trainer.accelerator=cpu"
        )


def values_problem(jobs: Jobs, name_the_job: bool) -> str | None:
    """The line of the first job's value `check_values` refuses (a value means the same on any machine), or
    None: the scripts' check before torch loads. `name_the_job`: add which job of a sweep it is."""
    return _first_problem(jobs, check_values, name_the_job)


def sweep_values_problem(jobs: Jobs) -> str | None:
    """The line of the first job `check` refuses, as the job itself will, before the first one starts; or None.
    Only where Hydra's launcher runs the jobs here: a job submitit runs on SLURM is checked there (on a machine
    without srun, submitit would fail with a traceback). `jobs`: the first with Hydra's node."""
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
