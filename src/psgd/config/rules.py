"""The checks a key's own schema cannot make, each problem one ConfigError line: rules that join keys where a
run would crash or hang (`check_values`: no torch, the scripts run it before it loads), at the start of every
job what depends on the machine: accelerator, launcher, the classes and checkpoints named (`check`), and a
command line's jobs judged before any starts (`checked_runs`, `sweep_values_problem`).
"""

import contextlib
import io
import math
import os
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from psgd import forkserver
from psgd.choices import INFO
from psgd.config.schema import Data, Plan, Run, Stragglers, validate
from psgd.config.targets import check_targets
from psgd.console import in_the_job
from psgd.environment import cpu_count
from psgd.errors import ConfigError
from psgd.strategies.contract import StrategyConfig

Jobs = list[tuple[list[str], DictConfig]]  # (overrides, config) of each job, as psgd.command_line composes them

# what to give instead, said by a line for a ckpt_path or init_weights that names no checkpoint
GIVE = {
    "ckpt_path": "give a .ckpt file or a run dir",
    "init_weights": "give a run dir, a .ckpt file or a weights file such as weights/rank0.pt",
}


def resolve_workers(run: Run) -> None:
    """`workers` is the knob; `trainer.devices` follows it unless set (then it wins if workers is 1)."""
    workers, devices = run.workers, run.trainer.devices
    if devices is not None and workers not in (1, devices):
        raise ConfigError(f"workers={workers} and trainer.devices={devices} disagree: set only one of them")


def resolve_accumulation(run: Run) -> int:
    """The micro-batches each worker accumulates per update: trainer.accumulate_grad_batches, or where set
    `parallel_batches` K spread over the workers."""
    k, world_size = run.parallel_batches, run.world_size
    if k is None:
        return run.trainer.accumulate_grad_batches or 1
    if k % world_size:
        raise ConfigError(
            f"parallel_batches={k} is invalid with {world_size} workers: it must be a multiple of the workers "
            f"(each accumulates parallel_batches / workers micro-batches), e.g. {world_size * max(1, k // world_size)}"
        )
    return k // world_size


def _partition(d: Data, workers: int) -> None:
    """What data.partition needs of the workers and of its own keys."""
    sizes = d.partition_sizes
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


def _own_pace(run: Run) -> None:
    """Several workers that do not keep in step each take their own number of steps (their own shard): what
    every worker must join inside an epoch (a validation, Lightning's stop for max_time or max_steps) would
    leave the others waiting at a collective until strategy.timeout_s."""
    t, world = run.trainer, run.world_size
    if world == 1 or run.strategy.lockstep:
        return
    vci = t.val_check_interval
    asked = {  # 1.0 (a float) is once per epoch, at its end; an int is a number of batches
        "val_check_interval": vci is not None and not (isinstance(vci, float) and vci == 1.0),
        "max_time": t.max_time is not None,
        "max_steps": t.max_steps not in (None, -1),
    }
    if key := next((key for key, given in asked.items() if given), None):
        raise ConfigError(
            f"trainer.{key}={getattr(t, key)} is invalid with strategy={run.strategy.name} and {world} workers: "
            "each worker takes its own number of steps and the others would wait for it; use trainer.max_epochs "
            "(and limit_train_batches), or strategy=ddp"
        )


def _stragglers(st: Stragglers, world: int) -> None:
    """stragglers.slowdown names every worker's factor: one per worker of all nodes."""
    if st.slowdown is not None and len(st.slowdown) != world:
        example = ", ".join(["1"] * (world - 1) + ["3"])
        shown = [int(f) if f == int(f) else f for f in st.slowdown]
        raise ConfigError(
            f"stragglers.slowdown={shown} is invalid with {world} workers: it takes one factor per worker "
            f"({world}), e.g. [{example}] for the last one three times slower; or null for none"
        )


# optimizers whose update is elementwise: one update of every simulated worker's stacked tensors is each worker's
ELEMENTWISE = ("torch.optim.SGD", "torch.optim.Adam", "torch.optim.AdamW", "torch.optim.RMSprop", "torch.optim.Adagrad")


def _simulation(run: Run) -> None:
    """What simulate=true cannot run, each one line: the strategy's own refusal (StrategyConfig.refuse_simulation),
    several nodes, an optimizer whose update is not elementwise, and the settings the simulated step does not take
    yet (accumulation, gradient clipping, another precision, torch.compile)."""
    if not run.simulate:
        return
    run.strategy.refuse_simulation(run)
    t = run.trainer
    target = run.optimizer.target
    if target not in ELEMENTWISE:
        raise ConfigError(
            f"optimizer._target_={target} is invalid with simulate=true: its update is not elementwise (NovoGrad "
            "normalises each layer), so one update of every worker's stacked parameters would mix them; use "
            f"{', '.join(ELEMENTWISE)}, or simulate=false"
        )
    refused = {
        "trainer.num_nodes": (t.num_nodes, t.num_nodes > 1, "simulated workers are one process on one machine"),
        "trainer.accumulate_grad_batches": (
            t.accumulate_grad_batches,
            (t.accumulate_grad_batches or 1) > 1,
            "a simulated step is one batch a worker",
        ),
        "parallel_batches": (run.parallel_batches, (run.parallel_batches or 1) > 1, "a step is one batch a worker"),
        "trainer.gradient_clip_val": (
            t.gradient_clip_val,
            t.gradient_clip_val is not None,
            "Lightning would clip every worker's gradients as one",
        ),
        "trainer.precision": (t.precision, str(t.precision) not in ("32", "32-true"), "simulation runs in fp32"),
        "compile": (run.compile, run.compile not in (False, None), "a replica's weights are views swapped per step"),
    }
    for key, (value, bad, why) in refused.items():
        if bad:
            raise ConfigError(f"{key}={value} is invalid with simulate=true: {why}; leave it out or use simulate=false")


def check_values(cfg: DictConfig) -> Run:
    """Every value the config alone decides (no torch, no machine): the schema, then the rules that join
    keys, the strategy's own among them. Returns the typed run; raises ConfigError."""
    run = validate(cfg)
    resolve_workers(run)
    epochs = run.trainer.max_epochs
    warmup = run.scheduler.trained()["warmup_epochs"]
    if warmup > epochs and not run.trainer.fast_dev_run:  # the lr would never reach optimizer.lr
        raise ConfigError(
            f"scheduler.warmup_epochs={warmup:g} is invalid with trainer.max_epochs={epochs}: the warm-up would not "
            f"end before training does; use warmup_epochs<={epochs}"
        )
    if run.scheduler.restart and run.ckpt_path is None:
        raise ConfigError(
            "scheduler.restart=true is invalid without ckpt_path: it starts a new lr schedule from a checkpoint's "
            "weights and optimizer state; give ckpt_path=<run dir> or leave scheduler.restart out"
        )
    run.strategy.refuse(run)
    _simulation(run)
    _own_pace(run)
    _stragglers(run.stragglers, run.world_size)
    _partition(run.data, run.workers_per_node)
    resolve_accumulation(run)
    return run


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


def resolve_accelerator(run: Run) -> str:
    """cpu or gpu: trainer.accelerator, with auto and cuda resolved on this machine (cpu for a strategy whose
    workers run on the CPU only)."""
    import torch

    accelerator, strategy = run.trainer.accelerator, run.strategy
    if accelerator == "auto":
        accelerator = "gpu" if torch.cuda.is_available() else "cpu"
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ConfigError(f"trainer.accelerator={accelerator!r} is invalid: no CUDA device is visible; use cpu or auto")
    if strategy.cpu_only and accelerator != "cpu":
        raise ConfigError(
            f"strategy={strategy.name} is invalid on GPU: its workers share one model in CPU shared memory; "
            "use trainer.accelerator=cpu (or strategy=ddp / model_averaging on GPU)"
        )
    return "gpu" if accelerator == "cuda" else accelerator


def resolve_start_method(strategy: StrategyConfig, accelerator: str) -> str:
    """The strategy's start method on `accelerator` (its own choice for null); forkserver is refused on GPU (a
    process that has used CUDA cannot fork workers that use it)."""
    method = strategy.resolved_start_method(accelerator, forkserver.available())
    if method == "forkserver" and accelerator != "cpu":
        raise ConfigError(
            f"strategy.start_method={method} is invalid on GPU: CUDA cannot be used in forked workers; "
            "use spawn, or null for the default"
        )
    return method


def launcher(run: Run) -> str:
    """Who starts the workers: torchrun or srun (as Lightning's cluster environments detect them in the Trainer),
    whose process counts must be the config's, or psgd on this machine."""
    from lightning_fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

    workers, nodes, tasks = run.workers_per_node, run.trainer.num_nodes, int(os.environ.get("SLURM_NTASKS", "1"))
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
    if run.simulate:
        raise ConfigError(
            f"simulate=true is invalid under {name}: simulated workers are one process on one machine; run "
            "`python train.py simulate=true workers=N` without a launcher"
        )
    if run.strategy.own_launcher:
        raise ConfigError(
            f"strategy={run.strategy.name} is invalid under {name}: its workers must be started by psgd to share "
            f"one model in memory; run `python train.py strategy={run.strategy.name} workers=N` on one machine "
            "instead"
        )
    if name == "srun" and tasks != run.world_size:
        raise ConfigError(
            f"SLURM started SLURM_NTASKS={tasks} tasks but workers x trainer.num_nodes = {run.world_size}: "
            "set workers to the tasks per node and trainer.num_nodes to the nodes (srun --ntasks-per-node)"
        )
    if name == "torchrun":
        local, world = int(os.environ["LOCAL_WORLD_SIZE"]), int(os.environ["WORLD_SIZE"])
        if (workers, run.world_size) != (local, world):
            raise ConfigError(
                f"workers={workers} trainer.num_nodes={nodes} do not match torchrun's {local} processes per "
                f"node and {world} in all: use workers={local} trainer.num_nodes={world // max(local, 1)}"
            )
    return name


def check(cfg: DictConfig) -> Plan:
    """Validate every value here on this machine (check_values, then the accelerator, the classes the config
    names, the checkpoints it reads and the launcher); returns the resolved plan, holding the typed run, or
    raises ConfigError."""
    run = check_values(cfg)
    accelerator = resolve_accelerator(run)
    check_targets(run)
    for setting in GIVE:  # here, not in check_values: a file is there on one machine and not on another
        if getattr(run, setting) is not None:
            checkpoint_file(setting, getattr(run, setting))
    started_by = launcher(run)
    workers = 1 if run.simulate else run.workers_per_node  # simulated workers: one process, one device
    if started_by == "psgd" and accelerator == "gpu":
        check_gpu_count(workers, "workers" if run.trainer.devices is None else "trainer.devices")
    return Plan(
        run=run,
        threads_per_worker=run.threads_per_worker or max(1, cpu_count() // workers),
        accelerator=accelerator,
        accumulate_grad_batches=resolve_accumulation(run),
        launcher=started_by,
        start_method=resolve_start_method(run.strategy, accelerator),
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


def checked_runs(jobs: Jobs, name_the_job: bool) -> tuple[str | None, list[Run]]:
    """The line of the first job's value `check_values` refuses (a value means the same on any machine), or
    None: the scripts' check before torch loads; and the typed runs of the jobs it passed. `name_the_job`: add
    which job of a sweep it is."""
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
    return _first_problem(jobs, check, name_the_job=True)[0]


def _first_problem(jobs: Jobs, judge: Callable[[DictConfig], Any], name_the_job: bool) -> tuple[str | None, list]:
    """The line of the first job `judge` refuses (or None), and what it returned for each job it passed."""
    passed = []
    for job, cfg in jobs:
        try:
            with contextlib.redirect_stderr(io.StringIO()):  # a warning: each job prints its own as it starts
                passed.append(judge(cfg))
        except ConfigError as e:
            return (in_the_job(e, job, [j for j, _ in jobs]) if name_the_job else str(e)), passed
        except Exception:  # anything else: left to the job, which reports it as its failure
            continue
    return None, passed
