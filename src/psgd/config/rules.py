"""The checks a key's own schema cannot make: rules that join several keys, and what depends on the
machine (accelerator, backend, GPUs, torchrun / srun, cores). Each problem is one ConfigError line.

`check_values` needs neither torch nor Lightning (the scripts run it before they load); `check`, at the
start of every job, runs it again and then the machine's checks.
"""

import math
import os
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from psgd import forkserver
from psgd.choices import BUILTIN, INFO
from psgd.config.schema import STRATEGIES, ConfigError, problem, said
from psgd.config.targets import check_targets
from psgd.console import warn
from psgd.environment import cpu_count

# a setting only that strategy's group (conf/strategy/<name>.yaml) has: tells which group was chosen
OWN_KEY = {"ddp": "find_unused_parameters", "model_averaging": "period", "hogwild": "lock"}
# Trainer arguments psgd passes itself (Lightning: "got multiple values for keyword argument")
SET_BY_PSGD = {
    "strategy": "choose it with strategy=ddp, model_averaging or hogwild",
    "logger": "every run logs to TensorBoard in its run dir",
    "callbacks": "add your own from Python: psgd.run.train(cfg, run_dir, callbacks=[...])",
    "use_distributed_sampler": "psgd's datamodule deals the samples to the workers itself (data.partition)",
    "enable_progress_bar": "a terminal gets a bar and a log file a line per epoch; quiet=true gives neither",
    "enable_model_summary": "quiet=true leaves it out",
    "enable_checkpointing": "every run keeps checkpoints/last.ckpt, which resuming and the final test use",
    "barebones": "every run logs, checkpoints and times its epochs, which barebones turns off",
}
# switches that act on a GPU only, with what they do there (a run on CPU is warned that they change nothing)
GPU_ONLY = (
    ("data.on_device", "it keeps the dataset on the GPU and makes batches there (on CPU it is in memory already)"),
    ("trainer.benchmark", "it runs cuDNN's autotuner for the GPU's convolutions"),
)
# scheduler=none keeps optimizer.lr constant whatever its other keys say (a sweep gives them to other schedules)
CONSTANT_LR = {"warmup_epochs": 0, "decay": "none", "interval": "epoch"}
# what to give instead, said by a ckpt_path or init_weights line that names no checkpoint
GIVE = {
    "ckpt_path": "give a .ckpt file or a run dir",
    "init_weights": "give a run dir, a .ckpt file or a weights file such as weights/rank0.pt",
}


@dataclass(frozen=True)
class Plan:
    """What the config resolves to: how many workers, threads each, and where they run."""

    workers: int
    threads_per_worker: int
    accelerator: str
    accumulate_grad_batches: int = 1  # micro-batches each worker accumulates per update
    launcher: str = "psgd"  # who starts the worker processes: psgd, or torchrun / srun (one per worker)
    start_method: str = "spawn"  # how psgd's launcher starts them (strategy.start_method, resolved)


def compile_mode(value: Any) -> str | None:
    """The torch.compile mode the `compile` setting asks for, or None (not compiled)."""
    return "default" if value is True else (value or None)


def schedule(scheduler: Mapping[str, Any]) -> dict[str, Any]:
    """The lr schedule a run trains with: its scheduler settings, but a constant lr for scheduler=none."""
    settings = dict(scheduler)
    if settings.get("name") == "none":
        settings.update(CONSTANT_LR)
    return settings


def resolve_workers(cfg: DictConfig) -> int:
    """`workers` is the knob; `trainer.devices` follows it unless set (then it wins if workers is 1)."""
    workers, devices = cfg.workers, cfg.trainer.get("devices")
    if devices is None:
        return workers
    if workers not in (1, devices):
        raise ConfigError(f"workers={workers} and trainer.devices={devices} disagree: set only one of them")
    return devices


def _strategy_group(s: DictConfig) -> None:
    """strategy.name set alone renames the chosen group's settings without choosing that strategy's."""
    if s.get("name") not in STRATEGIES:
        raise ConfigError(f"strategy={s.get('name')} is invalid: allowed: {', '.join(STRATEGIES)}")
    if OWN_KEY[s.name] in s:
        return
    chosen = next((name for name, key in OWN_KEY.items() if key in s), None)
    settings = f"strategy={chosen}'s" if chosen else "not that strategy's"
    raise ConfigError(
        f"strategy.name={s.name} alone does not choose a strategy: the settings are still {settings} (no "
        f"strategy.{OWN_KEY[s.name]}); use strategy={s.name} (in a preset's defaults: - override /strategy: {s.name})"
    )


def _partition(d: DictConfig, workers: int) -> None:
    """What data.partition needs of the workers and of its own keys."""
    if d.partition == "sizes":
        sizes = None if d.partition_sizes is None else list(d.partition_sizes)
        if sizes is None or len(sizes) != workers:
            raise ConfigError(
                f"data.partition_sizes={said(sizes)} is invalid: data.partition=sizes needs one fraction per worker "
                f"({workers}), summing to 1"
            )
        if not math.isclose(sum(sizes), 1.0, abs_tol=1e-6):
            raise ConfigError(
                f"data.partition_sizes={sizes} is invalid: fractions must sum to 1 (they sum to {sum(sizes):g})"
            )
    if d.partition == "by_label" and workers > INFO[d.name].num_classes:
        classes = INFO[d.name].num_classes
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
    """Several workers of model averaging or HogWild each take steps of their own number (their own shard):
    nothing every worker must join inside an epoch may be asked of them."""
    name, t = cfg.strategy.name, cfg.trainer
    if world == 1 or name == "ddp":
        return

    def refuse(setting: str, why: str) -> None:
        raise ConfigError(f"{setting} is invalid with strategy={name} and {world} workers: {why}")

    vci, max_time, max_steps = t.get("val_check_interval"), t.get("max_time"), t.get("max_steps")
    if vci is not None and not (isinstance(vci, float) and vci == 1.0):
        refuse(
            f"trainer.val_check_interval={vci}",
            "each worker runs a shard of its own length, so validations inside an epoch would not line up; use it "
            "with strategy=ddp or one worker",
        )
    if max_time is not None:
        refuse(
            f"trainer.max_time={max_time}",
            "Lightning decides it in a collective of every worker after each batch, and these workers take steps "
            "of their own number (one waited for the others until strategy.timeout_s); use trainer.max_epochs, "
            "or strategy=ddp",
        )
    if max_steps not in (None, -1):
        refuse(
            f"trainer.max_steps={max_steps}",
            "each worker counts its own steps and stops inside an epoch of its own, and the others waited for it "
            "at their epoch's end until strategy.timeout_s; use trainer.max_epochs (and "
            "trainer.limit_train_batches for shorter epochs), or strategy=ddp",
        )


def _schedule(cfg: DictConfig) -> None:
    """A warm-up of whole epochs unless the lr steps per step, ending before training does."""
    sch, t = cfg.scheduler, cfg.trainer
    if sch.interval == "epoch" and sch.warmup_epochs != int(sch.warmup_epochs):
        raise ConfigError(
            f"scheduler.warmup_epochs={sch.warmup_epochs} is invalid: must be an integer >= 0 (fractions of an "
            "epoch need scheduler.interval=step)"
        )
    warmup = schedule(sch)["warmup_epochs"]
    if warmup > t.max_epochs and not t.get("fast_dev_run"):  # the lr would never reach optimizer.lr
        raise ConfigError(
            f"scheduler.warmup_epochs={warmup} is invalid with trainer.max_epochs={t.max_epochs}: the warm-up "
            f"would not end before training does; use warmup_epochs<={t.max_epochs}"
        )


def _validation(cfg: DictConfig) -> None:
    """early_stop.target_acc is judged on validation: a run without any never stops early."""
    t, target = cfg.trainer, cfg.early_stop.target_acc
    if target is None:
        return
    if t.get("limit_val_batches") == 0:
        raise ConfigError(
            f"early_stop.target_acc={target} needs validation, and trainer.limit_val_batches=0 runs none: "
            "set trainer.limit_val_batches > 0 (or null for all), or early_stop.target_acc=null"
        )
    every = t.get("check_val_every_n_epoch")
    if every is not None and every > t.max_epochs and not t.get("fast_dev_run"):
        raise ConfigError(
            f"early_stop.target_acc={target} needs validation, and trainer.check_val_every_n_epoch={every} runs "
            f"none in trainer.max_epochs={t.max_epochs}: use check_val_every_n_epoch<={t.max_epochs}, or "
            "early_stop.target_acc=null"
        )


def _model(cfg: DictConfig) -> None:
    """The model's label, its own weight decay, and init_weights with independent initialisations."""
    name, target, decay = cfg.model.name, cfg.model.get("_target_"), cfg.optimizer.get("weight_decay")
    if name in BUILTIN and target != BUILTIN[name]:  # the label would name another model
        raise ConfigError(
            f"model.name={name} is only the run's label and the model is still {target}: use model={name} "
            "to train that model"
        )
    own_decay = sorted(k for k in cfg.model if str(k).startswith("weight_decay_"))  # the MLP's param groups
    if own_decay and decay:
        raise ConfigError(
            f"optimizer.weight_decay={decay} would have no effect with model={name}, which sets each layer's "
            f"decay itself: use model.{' and model.'.join(own_decay)}"
        )
    init = cfg.get("init_weights")
    if init is not None and cfg.strategy.get("same_init") is False:
        raise ConfigError(
            f"init_weights={init} is invalid with strategy.same_init=false: each worker would draw weights of "
            "its own over them; leave one of the two out"
        )


def resolve_accumulation(cfg: DictConfig, world_size: int) -> int:
    """`parallel_batches` K spreads K micro-batches per update over the workers: K / world_size each."""
    k, acc = cfg.get("parallel_batches"), cfg.trainer.get("accumulate_grad_batches") or 1
    if k is None:
        return acc
    if acc != 1:
        raise ConfigError(
            f"parallel_batches={k} and trainer.accumulate_grad_batches={acc} both set the accumulation: set one"
        )
    if k % world_size:
        raise ConfigError(
            f"parallel_batches={k} is invalid with {world_size} workers: it must be a multiple of the workers "
            f"(each accumulates parallel_batches / workers micro-batches), e.g. {world_size * max(1, k // world_size)}"
        )
    return k // world_size


def check_values(cfg: DictConfig) -> int:
    """Every value the config alone decides (no torch, no machine): the schema, then the rules that join
    keys. Raises ConfigError, or returns the workers per node."""
    _strategy_group(cfg.strategy)
    for key, why in SET_BY_PSGD.items():
        if key in cfg.trainer:
            raise ConfigError(f"trainer.{key} cannot be set: psgd decides it ({why}); leave +trainer.{key} out")
    if line := problem(cfg):
        raise ConfigError(line)
    workers = resolve_workers(cfg)
    t = cfg.trainer
    if cfg.strategy.name == "hogwild" and t.num_nodes != 1:
        raise ConfigError(
            f"trainer.num_nodes={t.num_nodes} is invalid with strategy=hogwild: shared memory spans one machine; "
            "use num_nodes=1"
        )
    _own_pace(cfg, workers * t.num_nodes)
    _partition(cfg.data, workers)
    _schedule(cfg)
    _validation(cfg)
    _model(cfg)
    resolve_accumulation(cfg, workers * t.num_nodes)
    return workers


def checkpoint_file(setting: str, value: str) -> Path:
    """The file a `setting` (ckpt_path, init_weights) names: a file, or a run dir (its
    checkpoints/last.ckpt) or that checkpoints/ folder; a sweep's dir, or no torch.save file there, is a
    ConfigError ending with what to give instead (GIVE)."""
    give = GIVE[setting]
    path = Path(value).expanduser()
    if path.is_dir():
        if (path / "multirun.yaml").is_file():  # a sweep's dir: its jobs are the runs
            jobs = sorted(
                (c.parent.parent for c in path.glob("*/checkpoints/last.ckpt")), key=lambda d: (len(d.name), d)
            )
            example = f", e.g. {jobs[0]}" if jobs else ""
            raise ConfigError(f"{setting}={value!r} is a sweep's dir: give one job's run dir{example}")
        if (path / "last.ckpt").is_file() and not (path / "checkpoints").exists():
            path = path / "last.ckpt"  # a run dir's checkpoints/ folder, given for the run dir
        else:
            path = path / "checkpoints" / "last.ckpt"
    if not path.is_file():
        raise ConfigError(f"{setting}={value!r} is invalid: no checkpoint at {path} ({give})")
    if not zipfile.is_zipfile(path):  # torch.save's format (Lightning's checkpoints too)
        raise ConfigError(f"{setting}={value!r} is not a checkpoint file ({give})")
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
    """strategy.start_method, or for null psgd's choice: HogWild's forkserver; on CPU psgd's fork server
    (workers start already loaded); on GPU spawn, since a process that has used CUDA cannot fork workers
    that use it."""
    method = s.get("start_method")
    if method is None:
        cpu = accelerator == "cpu" and forkserver.available()
        method = "forkserver" if s.name == "hogwild" or cpu else "spawn"
    if method == "forkserver" and accelerator != "cpu":
        raise ConfigError(
            f"strategy.start_method={method} is invalid on GPU: CUDA cannot be used in forked workers; "
            "use spawn, or null for the default"
        )
    if method == "forkserver" and not forkserver.available():
        raise ConfigError("strategy.start_method=forkserver is invalid on this platform (no fork servers); use spawn")
    return method


def external_launcher(world_size: int) -> str | None:
    """ "torchrun" or "srun" when that tool started this process as one of the workers (Lightning's own
    cluster environments decide, as they will in the Trainer), else None: psgd starts the workers."""
    from lightning_fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

    if TorchElasticEnvironment.detect():
        return "torchrun"
    if SLURMEnvironment.detect() and SLURMEnvironment.job_name() not in ("bash", "interactive"):
        tasks = int(os.environ.get("SLURM_NTASKS", "1"))
        if tasks > 1 and tasks != world_size:
            raise ConfigError(
                f"SLURM started SLURM_NTASKS={tasks} tasks but workers x trainer.num_nodes = {world_size}: "
                "set workers to the tasks per node and trainer.num_nodes to the nodes (srun --ntasks-per-node)"
            )
        return "srun" if tasks > 1 else None
    return None


def _launcher(cfg: DictConfig, workers: int, accelerator: str) -> str | None:
    """Who starts the workers; under torchrun / srun the counts must match that tool's."""
    name, nodes = cfg.strategy.name, cfg.trainer.num_nodes
    launcher = external_launcher(workers * nodes)
    if launcher and name == "hogwild":
        raise ConfigError(
            f"strategy=hogwild is invalid under {launcher}: its workers must be started by psgd to share one "
            "model in memory; run `python train.py strategy=hogwild workers=N` on one machine instead"
        )
    if launcher == "torchrun":
        world, local = int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_WORLD_SIZE"])
        if (workers, workers * nodes) != (local, world):
            raise ConfigError(
                f"workers={workers} trainer.num_nodes={nodes} do not match torchrun's {local} processes per "
                f"node and {world} in all: use workers={local} trainer.num_nodes={world // max(local, 1)}"
            )
    if not launcher and nodes > 1:
        raise ConfigError(
            f"trainer.num_nodes={nodes} needs a launcher that starts the workers on every node (torchrun "
            f"--nnodes {nodes} ... train.py, or srun --nodes {nodes} ...; see the README's Scaling out): "
            "psgd starts workers on this machine only; use trainer.num_nodes=1 here"
        )
    if not launcher and accelerator == "gpu":
        import torch

        gpus, key = torch.cuda.device_count(), "workers" if cfg.trainer.get("devices") is None else "trainer.devices"
        if workers > gpus:  # each worker psgd starts gets one visible device
            raise ConfigError(
                f"{key}={workers} is invalid on GPU: {gpus} CUDA device{'' if gpus == 1 else 's'} visible and each "
                f"worker needs its own; use {key}<={gpus}, or trainer.accelerator=cpu"
            )
    return launcher


def _on_this_machine(cfg: DictConfig, accelerator: str) -> None:
    """What the accelerator and this torch allow; a GPU-only switch on CPU is warned about."""
    import torch

    backend, cpu = cfg.strategy.get("backend"), accelerator == "cpu"
    if cfg.strategy.name == "hogwild" and not cpu:
        raise ConfigError(
            "strategy=hogwild is invalid on GPU: its workers share one model in CPU shared memory; "
            "use trainer.accelerator=cpu (or strategy=ddp / model_averaging on GPU)"
        )
    if backend == "nccl" and cpu:
        raise ConfigError(
            "strategy.backend=nccl is invalid on CPU: NCCL runs between GPUs; use gloo, or null for the default"
        )
    if backend == "mpi" and not torch.distributed.is_mpi_available():
        raise ConfigError("strategy.backend=mpi is invalid: this torch was built without MPI; use gloo or nccl")
    if compile_mode(cfg.compile) == "reduce-overhead" and cpu:
        raise ConfigError(
            "compile=reduce-overhead is invalid on CPU: it replays CUDA graphs, which need a GPU; use compile=true "
            "on CPU (or trainer.accelerator=gpu)"
        )
    if cfg.trainer.get("sync_batchnorm") and cpu:
        raise ConfigError(
            "trainer.sync_batchnorm=true is invalid on CPU: torch's SyncBatchNorm needs CUDA; "
            "use it with trainer.accelerator=gpu or leave it false"
        )
    for key, what in GPU_ONLY if cpu else ():
        if OmegaConf.select(cfg, key) is True:
            warn(f"{key}=true has no effect on CPU: {what}")


def warn_of_what_never_comes(cfg: DictConfig) -> None:
    """A setting read whose moment never comes in trainer.max_epochs: a step decay whose first step is at
    or after the last epoch, and an early_stop.patience longer than the run's validations."""
    t = cfg.trainer
    epochs = t.max_epochs
    if t.get("fast_dev_run"):
        return
    s = schedule(cfg.scheduler)
    if s["decay"] == "step":
        warm, size = s["warmup_epochs"] or 0, s["step_size"]
        if warm + size >= epochs:
            after = f"epoch {warm + size:g} (warm-up {warm:g} + step_size {size})" if warm else f"epoch {size}"
            most = math.ceil(epochs - warm) - 1
            use = f"use scheduler.step_size<={most}" if most >= 1 else "use a longer trainer.max_epochs"
            warn(
                f"scheduler.step_size={size} never comes: the step decay's first step is after {after}, and "
                f"trainer.max_epochs={epochs} ends training first, so the lr is never decayed (as with "
                f"scheduler.decay=none); {use}"
            )
    target, patience = cfg.early_stop.target_acc, cfg.early_stop.patience
    vci, every = t.get("val_check_interval"), t.get("check_val_every_n_epoch") or 1
    if target is not None and (vci is None or vci == 1.0) and patience > epochs // every:  # once per epoch at most
        how = f" (trainer.check_val_every_n_epoch={every})" if every > 1 else ""
        warn(
            f"early_stop.patience={patience} never comes: trainer.max_epochs={epochs} validates "
            f"{epochs // every} time(s){how}, fewer than the {patience} in a row at early_stop.target_acc={target} "
            f"it waits for, so the run never stops early (time_to_target_s is still recorded); use "
            f"early_stop.patience<={epochs // every}"
        )


def check(cfg: DictConfig) -> Plan:
    """Validate every value here on this machine (check_values, then what depends on the accelerator,
    torch and the environment); returns the resolved plan or raises ConfigError."""
    workers = check_values(cfg)
    accelerator = resolve_accelerator(cfg)
    _on_this_machine(cfg, accelerator)
    warn_of_what_never_comes(cfg)
    check_targets(cfg)
    for setting in GIVE:  # here, not in check_values: a file is there on one machine and not on another
        if cfg.get(setting) is not None:
            checkpoint_file(setting, cfg[setting])
    launcher = _launcher(cfg, workers, accelerator)
    threads = cfg.threads_per_worker
    if threads and threads > 1 and accelerator == "cpu" and threads * workers > cpu_count():
        warn(
            f"threads_per_worker={threads} x {workers} worker(s) is {threads * workers} threads "
            f"on {cpu_count()} cores: oversubscribed, every step waits on threads sharing a core (much slower); "
            "threads_per_worker=null uses cores // workers"
        )
    return Plan(
        start_method=resolve_start_method(cfg.strategy, accelerator),
        workers=workers,
        threads_per_worker=threads or max(1, cpu_count() // workers),
        accelerator=accelerator,
        accumulate_grad_batches=resolve_accumulation(cfg, workers * cfg.trainer.num_nodes),
        launcher=launcher or "psgd",
    )
