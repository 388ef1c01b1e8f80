"""Checking a composed config before any worker starts: each problem is one line naming the key,
the bad value and what is allowed.

`check_values` judges what the config alone decides and needs neither torch nor Lightning: the
scripts run it on the command line's jobs before those load (~4 s), so that a bad value is reported
in a fraction of a second. `check`, at the start of every job, runs it again and then what depends on the
machine and on torch: the accelerator, the process-group backend, the optimizer's own constructor,
the GPUs, torchrun / srun, the cores, the checkpoint files it names.
"""

import contextlib
import io
import math
import os
import shutil
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from psgd import forkserver
from psgd.choices import AUGMENTATIONS, BUILTIN, DECAYS, INFO, INTERVALS, LR_SCALING, SCHEMES
from psgd.console import gpus_by_id, in_the_job, override_key, text_lines, warn
from psgd.results import cpu_count, hogwild_workers, scales_by_workers

if TYPE_CHECKING:
    from torch import nn

STRATEGIES = ("ddp", "model_averaging", "hogwild")
# a setting only that strategy's config group (conf/strategy/<name>.yaml) has: tells which group was chosen
OWN_KEY = {"ddp": "find_unused_parameters", "model_averaging": "period", "hogwild": "lock"}
# how Lightning starts the workers of each strategy (HogWild's is fixed: Lightning's spawn would clone the
# shared model), and the process-group backends psgd runs on
START_METHODS = {
    "ddp": ("forkserver", "spawn"),
    "model_averaging": ("forkserver", "spawn"),
    "hogwild": ("forkserver",),
}
BACKENDS = ("gloo", "nccl", "mpi")
# settings that are true or false. Anything else is refused, not guessed: a typo such as `flase` is
# the string "flase", which Python reads as true. (trainer.* switches are Lightning's to check; an
# optimizer's are found from its constructor's defaults, in check_optimizer.)
SWITCHES = (
    "quiet",
    "record_shards",
    "record_weights",
    "checkpoint_every_epoch",
    "channels_last",
    "flush_denormal",
    "data.download",
    "data.verify_md5",
    "data.drop_last",
    "data.on_device",
    "model.batch_norm",
    "strategy.same_init",
    "strategy.average_buffers",
    "strategy.average_optimizer_state",
    "strategy.save_replicas",
    "strategy.lock",
    "strategy.find_unused_parameters",
    "strategy.ddp_for_one_worker",
)
_ABSENT = object()
# compile=...: torch.compile's modes (true is "default"; false or null: not compiled)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def compile_mode(value: Any) -> str | None:
    """The torch.compile mode the `compile` setting asks for, or None (not compiled); check_values
    has refused anything else."""
    return "default" if value is True else (value or None)


class ConfigError(ValueError):
    """A bad configuration value; str() is the one-line message shown to the user."""


class DirInUse(ConfigError):
    """The run dir holds an earlier run's results: nothing may be written there, not even a failure."""


@dataclass(frozen=True)
class Plan:
    """What the config resolves to: how many workers, threads each, and where they run."""

    workers: int
    threads_per_worker: int
    accelerator: str
    accumulate_grad_batches: int = 1  # micro-batches each worker accumulates per update
    launcher: str = "psgd"  # who starts the worker processes: psgd, or torchrun / srun (one per worker)
    start_method: str = "spawn"  # how psgd's launcher starts them (strategy.start_method, resolved)


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


def check_external(launcher: str, strategy: str, workers: int, num_nodes: int) -> None:
    """Under torchrun / srun every worker is started by that tool: the counts must match its own."""
    if strategy == "hogwild":
        raise ConfigError(
            f"strategy=hogwild is invalid under {launcher}: its workers must be started by psgd to share one "
            "model in memory; run `python train.py strategy=hogwild workers=N` on one machine instead"
        )
    if launcher == "torchrun":
        world, local = int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_WORLD_SIZE"])
        if (workers, workers * num_nodes) != (local, world):
            raise ConfigError(
                f"workers={workers} trainer.num_nodes={num_nodes} do not match torchrun's {local} processes per "
                f"node and {world} in all: use workers={local} trainer.num_nodes={world // max(local, 1)}"
            )


def check_processes(s: DictConfig) -> None:
    """How the strategy's workers start and talk: strategy.start_method and strategy.backend."""
    methods = START_METHODS[s.name]
    method = s.get("start_method")
    if len(methods) == 1:
        _need(
            method in (None, *methods), "strategy.start_method", method, f"strategy={s.name} always uses {methods[0]}"
        )
    else:
        # fork is not offered: a worker forked from a launcher that ran a torch operation on several
        # threads hangs in its first parallel one (GNU OpenMP's thread pool does not survive a fork)
        why = {
            "fork": "a forked worker hangs once the launcher has used OpenMP's threads; ",
            # (offered until 2026-11-24: in a sweep each worker re-ran the whole sweep and the run was killed;
            # in a run every worker tested and wrote the results)
            "popen": "Lightning's popen runs the whole command again for each worker (in a sweep: the sweep); ",
        }.get(method, "")
        allowed = f"{why}allowed: {', '.join(methods)}, or null"
        _need(method in (None, *methods), "strategy.start_method", method, allowed)
    backend = s.get("backend")
    _need(
        backend is None or backend in BACKENDS, "strategy.backend", backend, f"allowed: {', '.join(BACKENDS)}, or null"
    )


def resolve_start_method(s: DictConfig, accelerator: str) -> str:
    """strategy.start_method, or for null psgd's choice: HogWild's forkserver; on CPU psgd's fork server
    (psgd.forkserver: workers start already loaded); on GPU spawn, since a process that has used CUDA
    cannot fork workers that use it (nor can Lightning let it start a fork server's)."""
    methods, method = START_METHODS[s.name], s.get("start_method")
    if method is None:
        method = methods[0] if len(methods) == 1 or (accelerator == "cpu" and forkserver.available()) else "spawn"
    if method == "forkserver" and accelerator != "cpu":  # (HogWild on GPU is refused before this)
        raise ConfigError(
            f"strategy.start_method={method} is invalid on GPU: CUDA cannot be used in forked workers; "
            "use spawn, or null for the default"
        )
    if method == "forkserver" and not forkserver.available():
        raise ConfigError("strategy.start_method=forkserver is invalid on this platform (no fork servers); use spawn")
    return method


def check_backend(backend: str | None, accelerator: str) -> None:
    """strategy.backend on this machine, with this torch."""
    import torch

    if backend == "nccl" and accelerator == "cpu":  # (HogWild on GPU is refused before this)
        raise ConfigError(
            "strategy.backend=nccl is invalid on CPU: NCCL runs between GPUs; use gloo, or null for the default"
        )
    if backend == "mpi" and not torch.distributed.is_mpi_available():
        raise ConfigError("strategy.backend=mpi is invalid: this torch was built without MPI; use gloo or nccl")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


DURATION_UNITS = ("days", "hours", "minutes", "seconds")


def duration_s(value) -> float | None:
    """Seconds in a duration as Lightning's Timer (trainer.max_time) takes it: "DD:HH:MM:SS" or a
    mapping of timedelta's arguments; None for anything else."""
    try:
        if isinstance(value, str):
            parts = value.strip().split(":")
            if len(parts) != 4:
                return None
            return timedelta(**dict(zip(DURATION_UNITS, map(int, parts), strict=True))).total_seconds()
        if isinstance(value, DictConfig | dict):
            return timedelta(**{str(k): v for k, v in dict(value).items()}).total_seconds()
    except (TypeError, ValueError, OverflowError):
        return None
    return None


def _need(ok: bool, key: str, value, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{key}={'null' if value is None else repr(value)} is invalid: {allowed}")  # as typed


def devices_allowed(devices: Any) -> str:
    """What trainer.devices may be, with the way to what a Lightning user meant by a value psgd does
    not take: a list of device ids (which GPUs) or Lightning's "auto" / -1 (every device)."""
    allowed = "must be an integer >= 1 (or null to follow workers)"
    if isinstance(devices, str):  # "0,1" (quoted for Hydra)
        ids = [d.strip() for d in devices.split(",") if d.strip()]
    else:
        ids = [str(d) for d in devices] if isinstance(devices, Sequence) else []
    if advice := gpus_by_id(ids):
        return f"{allowed}, the number of workers; {advice}"
    if devices in ("auto", -1, "-1"):
        return f"{allowed}; Lightning's 'every device' is not taken: say how many workers with workers=N"
    return allowed


def resolve_workers(cfg: DictConfig) -> int:
    """`workers` is the knob; `trainer.devices` follows it unless set (then it wins if workers is 1)."""
    workers, devices = cfg.workers, cfg.trainer.get("devices")
    _need(_is_int(workers) and workers >= 1, "workers", workers, "must be an integer >= 1")
    if devices is None:
        return workers
    _need(_is_int(devices) and devices >= 1, "trainer.devices", devices, devices_allowed(devices))
    if workers not in (1, devices):
        raise ConfigError(f"workers={workers} and trainer.devices={devices} disagree: set only one of them")
    return devices


def check_accelerator_name(cfg: DictConfig) -> str:
    accelerator = cfg.trainer.get("accelerator", "auto")
    allowed = "allowed: auto, cpu, gpu (or cuda)"
    _need(accelerator in ("auto", "cpu", "gpu", "cuda"), "trainer.accelerator", accelerator, allowed)
    return accelerator


def resolve_accelerator(cfg: DictConfig) -> str:
    """cpu or gpu: trainer.accelerator, with auto and cuda resolved on this machine."""
    import torch

    accelerator = check_accelerator_name(cfg)
    if accelerator == "auto":
        return "gpu" if torch.cuda.is_available() else "cpu"
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ConfigError(f"trainer.accelerator={accelerator!r} is invalid: no CUDA device is visible; use cpu or auto")
    return "gpu" if accelerator == "cuda" else accelerator


def check_strategy_group(s: DictConfig) -> None:
    """strategy.name set alone (`strategy.name=hogwild`, or a preset's `strategy: {name: ...}`) renames
    the chosen group's settings without choosing that strategy's: the run failed on a setting it lacks
    ("Key 'lock' is not in struct"). Say which group the settings are from and how to choose one."""
    if OWN_KEY[s.name] in s:
        return
    chosen = next((name for name, key in OWN_KEY.items() if key in s), None)
    settings = f"strategy={chosen}'s" if chosen else "not that strategy's"
    raise ConfigError(
        f"strategy.name={s.name} alone does not choose a strategy: the settings are still {settings} (no "
        f"strategy.{OWN_KEY[s.name]}); use strategy={s.name} (in a preset's defaults: - override /strategy: {s.name})"
    )


def check_values(cfg: DictConfig) -> int:
    """Every value the config alone decides (no torch, no machine: the command line's check runs it
    before either); raises ConfigError, or returns the workers per node."""
    workers = resolve_workers(cfg)
    check_accelerator_name(cfg)
    t, d, opt, sch = cfg.trainer, cfg.data, cfg.optimizer, cfg.scheduler

    _need(cfg.strategy.name in STRATEGIES, "strategy", cfg.strategy.name, f"allowed: {', '.join(STRATEGIES)}")
    c = cfg.get("compile")
    _need(
        c is None or isinstance(c, bool) or c in COMPILE_MODES,
        "compile",
        c,
        f"allowed: false, true (torch.compile's default mode), {', '.join(COMPILE_MODES[1:])}",
    )
    check_strategy_group(cfg.strategy)
    if cfg.strategy.name == "model_averaging":
        period = cfg.strategy.period
        _need(
            period is None or (_is_int(period) and period >= 1),
            "strategy.period",
            period,
            "must be an integer >= 1 (average every that many steps), or null for only at the end",
        )
    if cfg.strategy.name == "hogwild":
        if t.num_nodes != 1:
            raise ConfigError(
                f"trainer.num_nodes={t.num_nodes} is invalid with strategy=hogwild: shared memory spans one "
                "machine; use num_nodes=1"
            )
    world = workers * t.num_nodes
    # several workers of model averaging or HogWild: each takes steps of its own number (its own shard), so
    # nothing that every worker must join inside an epoch may be asked of them
    own_pace = world > 1 and cfg.strategy.name != "ddp"
    vci = t.get("val_check_interval")
    if vci is not None:
        _need(
            _is_number(vci) and vci > 0 and (_is_int(vci) or vci <= 1),
            "trainer.val_check_interval",
            vci,
            "must be a fraction of an epoch in (0, 1] (e.g. 0.25), a whole number of batches, or null (once per epoch)",
        )
        if own_pace and not (isinstance(vci, float) and vci == 1.0):
            raise ConfigError(
                f"trainer.val_check_interval={vci} is invalid with strategy={cfg.strategy.name} and "
                f"{world} workers: each worker runs a shard of its own length, so validations "
                "inside an epoch would not line up; use it with strategy=ddp or one worker"
            )
    max_time = t.get("max_time")  # trainer.max_time=00:01:00:00 (Lightning's Timer)
    if max_time is not None:  # a zero duration trained nothing and reported chance accuracy, exit 0
        seconds = duration_s(max_time)
        _need(
            seconds is not None and seconds > 0,
            "trainer.max_time",
            max_time,
            "must be a duration longer than 0, as DD:HH:MM:SS (00:01:30:00) or {hours: 1, minutes: 30}",
        )
    if max_time is not None and own_pace:
        raise ConfigError(  # Lightning's Timer broadcasts its stop decision after every training batch
            f"trainer.max_time={max_time} is invalid with strategy={cfg.strategy.name} and {world} "
            "workers: Lightning decides it in a collective of every worker after each batch, and these workers take "
            "steps of their own number (one waited for the others until strategy.timeout_s); use "
            "trainer.max_epochs, or strategy=ddp"
        )
    max_steps = t.get("max_steps")  # trainer.max_steps=100; Lightning's -1: none
    _need(  # 0 trained nothing, exit 0; 3.5 ran as 3
        max_steps is None or (_is_int(max_steps) and (max_steps >= 1 or max_steps == -1)),
        "trainer.max_steps",
        max_steps,
        "must be an integer >= 1, or -1 for no limit (trainer.max_epochs ends training)",
    )
    if max_steps not in (None, -1) and own_pace:
        raise ConfigError(  # a worker that stopped inside an epoch left the others waiting at its end
            f"trainer.max_steps={max_steps} is invalid with strategy={cfg.strategy.name} and {world} "
            "workers: each worker counts its own steps and stops inside an epoch of its own, and the others waited "
            "for it at their epoch's end until strategy.timeout_s; use trainer.max_epochs (and "
            "trainer.limit_train_batches for shorter epochs), or strategy=ddp"
        )
    if cfg.strategy.name == "ddp":
        cap = cfg.strategy.get("bucket_cap_mb")
        _need(cap is None or (_is_number(cap) and cap > 0), "strategy.bucket_cap_mb", cap, "must be a number > 0")
    for key in SWITCHES:
        value = OmegaConf.select(cfg, key, default=_ABSENT)
        _need(value is _ABSENT or isinstance(value, bool), key, value, "must be true or false")
    check_processes(cfg.strategy)
    _need(
        _is_int(cfg.strategy.timeout_s) and cfg.strategy.timeout_s > 0,
        "strategy.timeout_s",
        cfg.strategy.timeout_s,
        "must be an integer number of seconds > 0",
    )
    _need(_is_int(t.num_nodes) and t.num_nodes >= 1, "trainer.num_nodes", t.num_nodes, "must be an integer >= 1")
    _need(
        _is_int(t.max_epochs) and t.max_epochs >= 1,
        "trainer.max_epochs",
        t.max_epochs,
        "must be an integer >= 1"
        + (
            # Lightning's "no epoch limit", for a run that trainer.max_steps or max_time ends
            " (Lightning's -1 or null, no limit, is not taken: psgd's lr schedules and records count epochs; "
            "to let trainer.max_steps or max_time end training, set max_epochs above the epochs they reach)"
            if t.max_epochs in (-1, None)
            else ""
        ),
    )
    _need(_is_int(cfg.seed) and cfg.seed >= 0, "seed", cfg.seed, "must be an integer >= 0")
    _check_trainer_values(cfg)
    threads = cfg.get("threads_per_worker")
    _need(
        threads is None or (_is_int(threads) and threads >= 1),
        "threads_per_worker",
        threads,
        "must be an integer >= 1, or null for cores // workers",
    )

    _need(d.name in INFO, "data.name", d.name, f"allowed: {', '.join(INFO)}")
    for key in ("batch_size", "eval_batch_size"):
        _need(_is_int(d[key]) and d[key] >= 1, f"data.{key}", d[key], "must be an integer >= 1")
    _need(isinstance(d.root, str), "data.root", d.root, "must be a folder (a path)")
    _need(d.partition in SCHEMES, "data.partition", d.partition, f"allowed: {', '.join(SCHEMES)}")
    _need(d.augment in AUGMENTATIONS, "data.augment", d.augment, f"allowed: {', '.join(AUGMENTATIONS)}")
    _need(
        _is_number(d.val_split) and 0 <= d.val_split < 1,
        "data.val_split",
        d.val_split,
        "must be a number in [0, 1)",
    )
    if d.partition == "sizes":
        sizes = list(d.partition_sizes) if OmegaConf.is_list(d.partition_sizes) else d.partition_sizes
        _need(
            isinstance(sizes, list) and len(sizes) == workers,
            "data.partition_sizes",
            sizes,
            f"data.partition=sizes needs one fraction per worker ({workers}), summing to 1",
        )
        _need(
            all(_is_number(s) and s > 0 for s in sizes),
            "data.partition_sizes",
            sizes,
            "every fraction must be > 0",
        )
        _need(
            math.isclose(sum(sizes), 1.0, abs_tol=1e-6),
            "data.partition_sizes",
            sizes,
            f"fractions must sum to 1 (they sum to {sum(sizes):g})",
        )
    if d.partition == "by_label":
        classes = INFO[d.name].num_classes
        _need(
            workers <= classes,
            "data.partition",
            "by_label",
            f"{workers} workers but data={d.name} has only {classes} classes: use at most {classes} workers",
        )
    if d.partition == "dirichlet":
        a = d.dirichlet_alpha
        _need(
            _is_number(a) and a > 0,
            "data.dirichlet_alpha",
            a,
            "data.partition=dirichlet needs a number > 0 (the label skew: smaller = more skewed, e.g. 0.5)",
        )

    _need(_is_number(opt.lr) and opt.lr > 0, "optimizer.lr", opt.lr, "must be a number > 0")
    if "momentum" in opt:
        _need(
            _is_number(opt.momentum) and 0 <= opt.momentum < 1,
            "optimizer.momentum",
            opt.momentum,
            "must be a number in [0, 1)",
        )
    if "weight_decay" in opt:
        _need(
            _is_number(opt.weight_decay) and opt.weight_decay >= 0,
            "optimizer.weight_decay",
            opt.weight_decay,
            "must be a number >= 0",
        )
        # a model that sets each layer's decay in its own param groups (the MLP) overrides the optimizer's
        own_decay = sorted(k for k in cfg.model if str(k).startswith("weight_decay_"))
        if own_decay and opt.weight_decay:
            raise ConfigError(
                f"optimizer.weight_decay={opt.weight_decay} would have no effect with model={cfg.model.get('name')}, "
                f"which sets each layer's decay itself: use model.{' and model.'.join(own_decay)}"
            )
    _need(cfg.lr_scaling in LR_SCALING, "lr_scaling", cfg.lr_scaling, f"allowed: {', '.join(LR_SCALING)}")
    reference = cfg.get("lr_reference_batch")
    if reference is not None:
        _need(_is_int(reference) and reference >= 1, "lr_reference_batch", reference, "must be an integer >= 1 or null")
    interval = sch.get("interval", "epoch")
    _need(interval in INTERVALS, "scheduler.interval", interval, f"allowed: {', '.join(INTERVALS)}")
    per_step = interval == "step"  # the lr moves after every optimizer step: a warm-up may end inside an epoch
    _need(
        (_is_number if per_step else _is_int)(sch.warmup_epochs) and sch.warmup_epochs >= 0,
        "scheduler.warmup_epochs",
        sch.warmup_epochs,
        "must be a number >= 0 (epochs; fractions allowed with scheduler.interval=step)"
        if per_step
        else "must be an integer >= 0 (fractions of an epoch need scheduler.interval=step)",
    )
    warmup_epochs = schedule(sch)["warmup_epochs"]
    if warmup_epochs > t.max_epochs and not t.get("fast_dev_run"):  # the lr would never reach optimizer.lr
        raise ConfigError(
            f"scheduler.warmup_epochs={warmup_epochs} is invalid with trainer.max_epochs={t.max_epochs}: the "
            f"warm-up would not end before training does; use warmup_epochs<={t.max_epochs}"
        )
    _need(sch.decay in DECAYS, "scheduler.decay", sch.decay, f"allowed: {', '.join(DECAYS)}")
    step, gamma = sch.get("step_size", 1), sch.get("gamma", 1)
    _need(_is_int(step) and step >= 1, "scheduler.step_size", step, "must be an integer >= 1 (epochs per lr step)")
    _need(_is_number(gamma) and gamma > 0, "scheduler.gamma", gamma, "must be a number > 0 (the lr factor per step)")
    sf = sch.get("start_factor")
    _need(
        sf is None or (_is_number(sf) and 0 < sf <= 1),
        "scheduler.start_factor",
        sf,
        "must be in (0, 1], or null for 1/workers",
    )

    es = cfg.early_stop
    _need(
        es.target_acc is None or (_is_number(es.target_acc) and 0 < es.target_acc <= 1),
        "early_stop.target_acc",
        es.target_acc,
        "must be in (0, 1], or null for no early stop",
    )
    _need(_is_int(es.patience) and es.patience >= 1, "early_stop.patience", es.patience, "must be an integer >= 1")
    _need(isinstance(cfg.model.get("name"), str), "model.name", cfg.model.get("name"), "must be a name (a string)")
    name, target = cfg.model.name, cfg.model.get("_target_")
    if name in BUILTIN and target != BUILTIN[name]:  # the label would say one model while another one trains
        raise ConfigError(
            f"model.name={name} is only the run's label and the model is still {target}: use model={name} "
            "to train that model"
        )
    ckpt = cfg.get("ckpt_path")
    _need(
        ckpt is None or (isinstance(ckpt, str) and ckpt != ""),  # ('': "no checkpoint at checkpoints/last.ckpt")
        "ckpt_path",
        ckpt,
        "must be a checkpoint file or run dir (a path; null, the default, starts a new run)",
    )
    init = cfg.get("init_weights")
    _need(
        init is None or (isinstance(init, str) and init != ""),
        "init_weights",
        init,
        "must be an earlier run's dir, a .ckpt file or a weights file (a path)",
    )
    if init is not None and cfg.strategy.name == "model_averaging" and cfg.strategy.get("same_init") is False:
        raise ConfigError(
            f"init_weights={init} is invalid with strategy.same_init=false: each worker would draw weights of "
            "its own over them; leave one of the two out"
        )
    logs = t.get("log_every_n_steps")
    _need(logs is None or (_is_int(logs) and logs >= 1), "trainer.log_every_n_steps", logs, "must be an integer >= 1")
    if "dropout" in cfg.model:  # the models that have one (null too: it used to reach the model's `<`)
        dropout = cfg.model.dropout
        _need(_is_number(dropout) and 0 <= dropout < 1, "model.dropout", dropout, "must be a number in [0, 1)")

    resolve_accumulation(cfg, world)
    return workers


# what to give instead, said by a ckpt_path or init_weights line that names no checkpoint
GIVE = {
    "ckpt_path": "give a .ckpt file or a run dir",
    "init_weights": "give a run dir, a .ckpt file or a weights file such as weights/rank0.pt",
}


def checkpoint_file(setting: str, value: str) -> Path:
    """The file a `setting` (ckpt_path, init_weights) names: a file, or a run dir (its
    checkpoints/last.ckpt) or that checkpoints/ folder; a sweep's dir, or no torch.save file there, is a
    ConfigError ending with what to give instead (GIVE)."""
    give = GIVE[setting]
    path = Path(value).expanduser()  # as data.root: ckpt_path='~/runs/...'
    if path.is_dir():
        if (path / "multirun.yaml").is_file():  # a sweep's dir: its jobs are the runs
            jobs = [c.parent.parent for c in path.glob("*/checkpoints/last.ckpt")]
            jobs.sort(key=lambda d: (len(d.name), d))  # 0, 1, ..., 10
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


# switches that act on a GPU only, with what they do there (a run on CPU is warned that they change nothing)
GPU_ONLY = (
    ("data.on_device", "it keeps the dataset on the GPU and makes batches there (on CPU it is in memory already)"),
    ("trainer.benchmark", "it runs cuDNN's autotuner for the GPU's convolutions"),
)


def check(cfg: DictConfig) -> Plan:
    """Validate every user-facing value, here on this machine (check_values, then what depends on the
    accelerator, torch and the environment); returns the resolved plan or raises ConfigError."""
    workers = check_values(cfg)
    accelerator = resolve_accelerator(cfg)
    t = cfg.trainer
    if cfg.strategy.name == "hogwild" and accelerator != "cpu":
        raise ConfigError(
            "strategy=hogwild is invalid on GPU: its workers share one model in CPU shared memory; "
            "use trainer.accelerator=cpu (or strategy=ddp / model_averaging on GPU)"
        )
    check_backend(cfg.strategy.get("backend"), accelerator)
    if compile_mode(cfg.get("compile")) == "reduce-overhead" and accelerator == "cpu":
        raise ConfigError(
            "compile=reduce-overhead is invalid on CPU: it replays CUDA graphs, which need a GPU; use compile=true "
            "on CPU (or trainer.accelerator=gpu)"
        )
    if t.get("sync_batchnorm") and accelerator == "cpu":
        raise ConfigError(
            "trainer.sync_batchnorm=true is invalid on CPU: torch's SyncBatchNorm needs CUDA; "
            "use it with trainer.accelerator=gpu or leave it false"
        )
    if accelerator == "cpu":
        for key, what in GPU_ONLY:
            if OmegaConf.select(cfg, key) is True:
                warn(f"{key}=true has no effect on CPU: {what}")
    warn_of_what_never_comes(cfg)
    net = check_model(cfg.model, cfg.data.name)
    check_optimizer(cfg.optimizer)
    if net is not None and (sparse := sparse_gradient_modules(net)):
        check_sparse_gradients(cfg.optimizer, cfg.model.get("name"), sparse[0])
    for setting in GIVE:  # here, not in check_values: a file is there on one machine and not on another (a
        # sweep's jobs on SLURM); a sweep run here finds a missing one before its first job, not in every job
        if cfg.get(setting) is not None:
            checkpoint_file(setting, cfg[setting])
    accumulate = resolve_accumulation(cfg, workers * t.num_nodes)
    launcher = external_launcher(workers * t.num_nodes)
    if launcher:
        check_external(launcher, cfg.strategy.name, workers, t.num_nodes)
    elif t.num_nodes > 1:  # psgd's workers waited for the other nodes' until strategy.timeout_s (30 min)
        raise ConfigError(
            f"trainer.num_nodes={t.num_nodes} needs a launcher that starts the workers on every node (torchrun "
            f"--nnodes {t.num_nodes} ... train.py, or srun --nodes {t.num_nodes} ...; see the README's Scaling out): "
            "psgd starts workers on this machine only; use trainer.num_nodes=1 here"
        )
    elif accelerator == "gpu":
        check_gpu_count(workers, "workers" if t.get("devices") is None else "trainer.devices")
    per_node, threads = workers, cfg.get("threads_per_worker")
    if threads and threads > 1 and accelerator == "cpu" and threads * per_node > cpu_count():
        # OpenMP threads that share a core wait on each other at every parallel region: the lab CNN ran
        # ~45x slower with threads_per_worker=64 on 2 cores (192 vs ~9000 samples/s). One thread per
        # worker beyond the cores (workers=5 on 2 cores) is a legitimate experiment and not warned about.
        warn(
            f"threads_per_worker={threads} x {per_node} worker(s) is {threads * per_node} threads "
            f"on {cpu_count()} cores: oversubscribed, every step waits on threads sharing a core (much slower); "
            "threads_per_worker=null uses cores // workers"
        )
    threads = threads or max(1, cpu_count() // per_node)
    return Plan(
        start_method=resolve_start_method(cfg.strategy, accelerator),
        workers=workers,
        threads_per_worker=threads,
        accelerator=accelerator,
        accumulate_grad_batches=accumulate,
        launcher=launcher or "psgd",
    )


def warn_of_what_never_comes(cfg: DictConfig) -> None:
    """A setting that is read but whose moment never comes in trainer.max_epochs: a step decay whose
    first step is at or after the last epoch (scheduler.step_size defaults to 30, the default run has 8
    epochs: `scheduler.decay=step` alone trained at a constant lr), and an early_stop.patience longer than
    the run's validations (no run stopped early). Each run trained as if the setting were not there."""
    t = cfg.trainer
    epochs = t.max_epochs
    if epochs in (-1, None) or t.get("fast_dev_run"):
        return
    s = schedule(cfg.scheduler)
    if s.get("decay") == "step":
        warm, size = s.get("warmup_epochs") or 0, s.get("step_size")
        if warm + size >= epochs:
            after = f"epoch {warm + size:g} (warm-up {warm:g} + step_size {size})" if warm else f"epoch {size}"
            most = math.ceil(epochs - warm) - 1
            use = f"use scheduler.step_size<={most}" if most >= 1 else "use a longer trainer.max_epochs"
            warn(
                f"scheduler.step_size={size} never comes: the step decay's first step is after {after}, and "
                f"trainer.max_epochs={epochs} ends training first, so the lr is never decayed (as with "
                f"scheduler.decay=none); {use}"
            )
    target, patience = cfg.early_stop.get("target_acc"), cfg.early_stop.get("patience")
    vci, every = t.get("val_check_interval"), t.get("check_val_every_n_epoch") or 1
    if target is not None and (vci is None or (isinstance(vci, float) and vci == 1.0)):  # once per epoch at most
        validations = epochs // every
        if patience > validations:
            how = f" (trainer.check_val_every_n_epoch={every})" if every > 1 else ""
            warn(
                f"early_stop.patience={patience} never comes: trainer.max_epochs={epochs} validates "
                f"{validations} time(s){how}, fewer than the {patience} in a row at early_stop.target_acc={target} "
                f"it waits for, so the run never stops early (time_to_target_s is still recorded); use "
                f"early_stop.patience<={validations}"
            )


Jobs = list[tuple[list[str], DictConfig]]  # (overrides, config) of each job, as psgd.command_line composes them


# scheduler=none keeps optimizer.lr constant, whatever the schedule's other settings say. They are in its preset so
# that a sweep such as `scheduler=none,warmup scheduler.warmup_epochs=1` can give them to the warm-up's jobs: there
# the none jobs warmed up too, and the sweep compared two identical schedules under two names.
CONSTANT_LR = {"warmup_epochs": 0, "decay": "none", "interval": "epoch"}


def schedule(scheduler: Mapping[str, Any]) -> dict[str, Any]:
    """The lr schedule a run trains with: its scheduler settings, but a constant lr for scheduler=none."""
    settings = dict(scheduler)
    if settings.get("name") == "none":
        settings.update(CONSTANT_LR)
    return settings


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


def _said(value: Any) -> str:
    """A setting's value as the command line writes it ([0.7, 0.3], true, null)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(OmegaConf.to_container(value) if OmegaConf.is_config(value) else value)


def _one_workers_factors(jobs: Jobs) -> list[str]:
    """The lr factors that default to the worker count, chosen for runs of one worker: a warm-up from
    lr x start_factor, null = 1/workers, is a constant lr there (`sweep.py -m scheduler=none,warmup`
    compared one schedule under two names), and lr_scaling without lr_reference_batch multiplies the lr by
    the workers, 1. Said when no job of the command line gets a factor other than 1."""

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
    land on the one model, about P times one worker's step already, and the lr P times larger on top
    (`sweep.py -m workers=1,2,3,4,5 strategy=hogwild lr_scaling=linear` ran the 5 workers at lr 0.1). Said
    once, for the job with the most workers; lr_reference_batch scales by an update's samples instead."""
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
    """A warning line for each setting the command line gives a value that no job of it reads:
    `workers=2 data.partition_sizes=[0.7,0.3]` without data.partition=sizes trained iid shards, and
    nothing said so. A setting that some job of a sweep reads is not warned about for the others, nor
    one a preset sets (experiment=dist_tuto sets partition_sizes for its data.partition=sizes jobs, and
    `python train.py experiment=dist_tuto` alone runs iid)."""
    lines, warned = [], set()
    for key, other, reads, wording in READ_ONLY_WHEN:
        others = (other,) if isinstance(other, str) else other
        given = _given(jobs, key, lambda cfg, others=others: [OmegaConf.select(cfg, o) for o in others])
        if key not in warned and given and not any(reads(*chosen) for _, chosen in given):
            choosers = " ".join(  # as typed; scheduler.name: the preset chosen, as the command line says it
                f"{o.removesuffix('.name')}={','.join(dict.fromkeys(_said(c[i]) for _, c in given))}"
                for i, o in enumerate(others)
            )
            lines.append(f"{key}={_said(given[0][0])} has no effect with {choosers}: it is read with {wording}")
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
                f"{key}={_said(given[0][0])} has no effect with {choosers}: it is read{by} with more than one "
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
    damaged ones are downloaded now (as a single run does before its workers start), not tried, and
    failed, by every job of a mistyped data.root in turn. Only for Hydra's basic launcher, whose jobs
    run on this machine."""
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
    Each dataset and folder is decoded once (MNIST: ~0.25 s); each job then deals its shards as it will
    (~ms). The datamodule is the job's own (run.build_datamodule) but for the image size, which no
    batch count depends on; so is the check (run.check_data). Every job has passed `check` already."""
    from psgd.data.datasets import DataError
    from psgd.run import build_datamodule, check_data, check_memory

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


def model_arguments(model_cfg: DictConfig, data_name: str) -> tuple[type, dict[str, Any], int]:
    """The network's class, its constructor's keyword arguments (the config's and the dataset's channels and
    classes) and the image size it takes with this dataset, or a ConfigError: a class that cannot be
    imported, a model that needs other images than the dataset has (a 28x28-only model on 32x32 CIFAR10),
    a setting its constructor has no argument for."""
    import inspect

    params = OmegaConf.to_container(model_cfg, resolve=True)
    name, target = params.pop("name"), params.pop("_target_")
    cls = locate("model._target_", target)
    info = INFO[data_name]
    size, needed = info.size, getattr(cls, "input_size", None)
    if needed is not None and needed != size:
        if not getattr(cls, "resize_input", False):
            fits = [d for d, i in INFO.items() if i.size == needed]
            raise ConfigError(
                f"model={name} needs {needed}x{needed} inputs but data={data_name} has {size}x{size} images; "
                f"allowed data for {name}: {', '.join(fits)}"
            )
        size = needed
    given = {"in_channels": info.channels, "num_classes": info.num_classes}  # psgd's, from the dataset
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):  # none to read (a class made in C): the constructor judges
        return cls, {**given, **params}, size
    takes = [k for k, p in signature.parameters.items() if k not in given and p.kind is not p.VAR_POSITIONAL]
    foreign = [k for k in params if k not in signature.parameters]
    if foreign and not any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
        settings = " and ".join(f"model.{k}={params[k]}" for k in foreign)
        raise ConfigError(
            f"{settings} {'is not a setting' if len(foreign) == 1 else 'are not settings'} of model={name} "
            f"({target} takes: {', '.join(takes) or 'none'}); leave {'it' if len(foreign) == 1 else 'them'} out"
        )
    try:
        signature.bind(**given, **params)
    except TypeError as e:  # a required argument not given
        raise ConfigError(f"model={name}: {e}") from e
    return cls, {**given, **params}, size


def meta_network(model_cfg: DictConfig, data_name: str) -> tuple[Any, int]:
    """The job's network built on the meta device (no memory, no random numbers) and the image size it
    takes; model_arguments' ConfigError, or what its constructor raises (also what it cannot do on meta)."""
    import torch

    cls, arguments, size = model_arguments(model_cfg, data_name)
    with torch.device("meta"):
        return cls(**arguments), size


def sparse_gradient_modules(net: "nn.Module") -> list[str]:
    """`net`'s modules that make sparse gradients (nn.Embedding / nn.EmbeddingBag with sparse=True), by name."""
    import torch

    kinds = (torch.nn.Embedding, torch.nn.EmbeddingBag)
    return [
        f"{name or 'network'} ({type(m).__name__}, sparse=True)"
        for name, m in net.named_modules()
        if isinstance(m, kinds) and m.sparse
    ]


# the way out for an optimizer that refuses sparse gradients: said by check_sparse_gradients before a run, and by
# cli.REMEDIES after torch's error where the run met ones check could not foresee
SPARSE_GRADIENTS_WAY_OUT = "use optimizer=sgd optimizer.fused=false, whose per-tensor update takes them"


def check_sparse_gradients(opt: DictConfig, model_name: str | None, module: str) -> None:
    """A model whose `module` makes sparse gradients, with an optimizer that refuses them at the first
    step in every worker: Adam and NovoGrad whatever their settings (their errors suggest SparseAdam,
    which takes sparse gradients only, and a model's other layers have dense ones), SGD's fused update
    (its error names no way out). torch's per-tensor SGD takes them."""
    import torch
    import torch_optimizer

    target = opt.get("_target_")
    cls = locate("optimizer._target_", target)
    if isinstance(cls, type) and issubclass(cls, (torch.optim.Adam, torch_optimizer.NovoGrad)):  # AdamW too
        raise ConfigError(
            f"optimizer._target_={target} is invalid with model={model_name}: its {module} makes sparse "
            f"gradients, which {cls.__name__} refuses; {SPARSE_GRADIENTS_WAY_OUT}"
        )
    if opt.get("fused"):
        raise ConfigError(
            f"optimizer.fused=true is invalid with model={model_name}: its {module} makes sparse "
            "gradients, which the fused update refuses; set optimizer.fused=false"
        )


def check_model(model_cfg: DictConfig, data_name: str) -> "nn.Module | None":
    """model_arguments' checks, the constructor's own (MLP's model.hidden=0) and a forward pass of the
    dataset's image shape, on the meta device (no memory, no random numbers; 5-25 ms). In `check`, so that
    a sweep refuses such a job before its first job runs, not when that job's turn comes (build_model
    builds and runs the network itself): a model class of the user's that fits MNIST's 28x28 images and
    not CIFAR10's 32x32 ones, in `sweep.py -m data=mnist,cifar10`, failed the CIFAR10 jobs as they started.
    Returns the network on the meta device, or None where its constructor cannot build it there."""
    import torch

    try:
        net, size = meta_network(model_cfg, data_name)
    except ConfigError:
        raise
    except ValueError as e:  # a value the model refuses, named in its message (build_model says the same)
        raise ConfigError(str(e)) from e
    except Exception:  # what a constructor cannot do on the meta device: build_model judges it
        return None
    info = INFO[data_name]
    try:
        net.eval()
        with torch.no_grad():
            net(torch.zeros(2, info.channels, size, size, device="meta"))
    except Exception:
        # A shape that does not fit, or only what meta tensors cannot do (.item(), an operation without a
        # meta kernel): the network is built and run on the CPU as the job will (build_model), whose line
        # the job would have said, with torch's random numbers left as they were for the run's seeded weights.
        from psgd.run import build_model

        with torch.random.fork_rng(devices=[]):
            build_model(model_cfg, data_name)
    return net


def locate(key: str, target: object) -> type:
    """The class a `_target_` names, imported; else a ConfigError naming `key` and why (a module not
    installed, a misspelt name). Hydra's get_class logged three ERROR lines first and raised a message
    whose line said only "Are you sure that module 'x' is installed?"."""
    import logging

    from hydra.utils import get_class

    _need(isinstance(target, str) and "." in target, key, target, "must name a class as module.Class")
    log = logging.getLogger("hydra.utils")
    was, log.disabled = log.disabled, True
    try:
        return get_class(target)
    except ImportError as e:
        cause = e.__cause__ or e
        module, _, name = target.rpartition(".")
        if isinstance(cause, ModuleNotFoundError) and cause.name == target:  # the module is there, the name not
            why = f"module {module} has no {name}"
        else:
            why = f"{type(cause).__name__}: {text_lines(cause)[-1]}"
        top = target.split(".")[0]
        here = isinstance(cause, ModuleNotFoundError) and cause.name == top
        if here and (os.path.isfile(f"{top}.py") or os.path.isdir(top)):
            # python train.py puts the script's folder on the path, not the current one
            why += f"; {top} is in the current folder, which is not on Python's path: run with PYTHONPATH=."
        raise ConfigError(f"{key}={target} cannot be imported ({why})") from e
    except ValueError as e:  # it names something other than a class
        raise ConfigError(f"{key}={target} is invalid: {text_lines(e)[-1]}") from e
    finally:
        log.disabled = was


def check_optimizer(opt: DictConfig) -> None:
    """The optimizer's own checks, here rather than in each worker: build it once on a stand-in
    parameter, so a value its constructor refuses (`optimizer.betas=[2,3]` for NovoGrad, SGD's
    `nesterov=true` with `momentum=0`) is one line naming the settings before anything starts, not a
    traceback from every worker. A key it has no argument for is named with what it takes."""
    import inspect

    import torch
    from hydra.utils import instantiate

    cls = locate("optimizer._target_", opt.get("_target_"))
    try:  # a number setting given true (Python's bool is an int: eps=true would run as eps=1) ...
        defaults = inspect.signature(cls).parameters
    except (TypeError, ValueError):  # no signature to read: instantiate below names any problem
        defaults = {}
    for key, value in opt.items():
        default = defaults[key].default if key in defaults else None
        if isinstance(value, bool) and _is_number(default):
            raise ConfigError(f"optimizer.{key}={value} is invalid: must be a number (the default is {default})")
        # ... and a switch given anything else (torch's fused and foreach default to None: its own choice)
        switch = isinstance(default, bool) or (key in ("fused", "foreach") and value is not None)
        if switch and not isinstance(value, bool):
            _need(False, f"optimizer.{key}", value, "must be true or false")
    # a setting it has no argument for, with the way out: a preset's setting for another optimizer
    # (experiment=dli_fashion optimizer=novograd kept SGD's momentum: NovoGrad's TypeError named no remedy)
    takes = [k for k, p in defaults.items() if k != "params" and p.kind is not inspect.Parameter.VAR_POSITIONAL]
    if defaults and not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in defaults.values()):
        foreign = [str(k) for k in opt if not str(k).startswith("_") and k not in defaults]
        if foreign:
            given = " and ".join(f"optimizer.{k}={opt[k]}" for k in foreign)
            drop = "it" if len(foreign) == 1 else "them"
            raise ConfigError(
                f"{given} {'is not a setting' if len(foreign) == 1 else 'are not settings'} of "
                f"{opt.get('_target_')} (it takes: {', '.join(takes)}); leave {drop} out (where a preset set "
                f"{drop} for another optimizer, drop {drop} with {' '.join(f'~optimizer.{k}' for k in foreign)})"
            )
    try:
        instantiate(opt, _convert_="all")([torch.zeros(1, requires_grad=True)])  # as run.py makes it
    except Exception as e:
        settings = " ".join(f"{k}={v}" for k, v in opt.items() if not str(k).startswith("_"))
        reason = text_lines(e.__cause__ or e)[-1]
        raise ConfigError(
            f"optimizer settings are invalid: {opt.get('_target_')} refuses them ({reason}); "
            f"the settings were: {settings}"
        ) from e


def check_gpu_count(workers: int, key: str) -> None:
    """Workers psgd starts on GPU get one visible device each: Lightning refuses more devices than it
    sees (with a traceback), and NCCL two ranks on one GPU. (torchrun and srun place their own
    workers: a task there may see only its own GPU.)"""
    import torch

    gpus = torch.cuda.device_count()
    if workers > gpus:
        raise ConfigError(
            f"{key}={workers} is invalid on GPU: {gpus} CUDA device{'' if gpus == 1 else 's'} visible and each "
            f"worker needs its own; use {key}<={gpus}, or trainer.accelerator=cpu"
        )


# Trainer arguments psgd passes itself: `+trainer.<key>` met them as "got multiple values for keyword
# argument" from Lightning (or, for enable_checkpointing=false, as a clash with psgd's checkpoint)
SET_BY_PSGD = {
    "strategy": "choose it with strategy=ddp, model_averaging or hogwild",
    "logger": "every run logs to TensorBoard in its run dir",
    "callbacks": "add your own from Python: psgd.run.train(cfg, run_dir, callbacks=[...])",
    "use_distributed_sampler": "psgd's datamodule deals the samples to the workers itself (data.partition)",
    "enable_progress_bar": "a terminal gets a bar and a log file a line per epoch; quiet=true gives neither",
    "enable_model_summary": "quiet=true leaves it out",
    "enable_checkpointing": "every run keeps checkpoints/last.ckpt, which resuming and the final test use",
    "barebones": "every run logs, checkpoints and times its epochs, which barebones turns off; the step is "
    "already lean: see benchmarks/README.md",
}


def _check_trainer_values(cfg: DictConfig) -> None:
    """trainer.* values Lightning would take silently for something other than what they say, or
    fail on with a traceback from inside fit."""
    t = cfg.trainer
    for key, why in SET_BY_PSGD.items():
        if key in t:
            raise ConfigError(f"trainer.{key} cannot be set: psgd decides it ({why}); leave +trainer.{key} out")
    # Lightning takes 0 as "skip training" (the run then reports an untrained model as completed) or
    # "skip the test" (every run ends with one, whose accuracy it reports: 0 failed after training), and a
    # negative clip value as "no clipping": none is what a user writing them means. 0 validation batches
    # is a run without validation.
    for split, zero in (("train", False), ("val", True), ("test", False)):
        key = f"trainer.limit_{split}_batches"
        limit = OmegaConf.select(cfg, key)
        _need(
            limit is None or (_is_number(limit) and (limit >= 0 if zero else limit > 0)),
            key,
            limit,
            f"must be {'>=' if zero else '>'} 0 (a fraction of the batches up to 1.0, or a number of batches), "
            "or null for all",
        )
    target = OmegaConf.select(cfg, "early_stop.target_acc")
    if target is not None and t.get("limit_val_batches") == 0:  # the target could never be seen: no early stop
        raise ConfigError(
            f"early_stop.target_acc={target} needs validation, and trainer.limit_val_batches=0 runs none: "
            "set trainer.limit_val_batches > 0 (or null for all), or early_stop.target_acc=null"
        )
    every = t.get("check_val_every_n_epoch")  # 0: a ZeroDivisionError traceback from inside fit
    _need(
        every is None or (_is_int(every) and every >= 1),
        "trainer.check_val_every_n_epoch",
        every,
        "must be an integer >= 1",
    )
    if target is not None and every is not None and every > t.max_epochs and not t.get("fast_dev_run"):
        raise ConfigError(  # the first validation would come after the last epoch: the target is never seen
            f"early_stop.target_acc={target} needs validation, and trainer.check_val_every_n_epoch={every} runs "
            f"none in trainer.max_epochs={t.max_epochs}: use check_val_every_n_epoch<={t.max_epochs}, or "
            "early_stop.target_acc=null"
        )
    sanity = t.get("num_sanity_val_steps")  # below -1: silently none
    _need(
        sanity is None or (_is_int(sanity) and sanity >= -1),
        "trainer.num_sanity_val_steps",
        sanity,
        "must be an integer >= 0, or -1 for all validation batches",
    )
    fast = t.get("fast_dev_run")  # Lightning's own refusal of text did not name the key ("invalid literal for int()")
    _need(
        fast is None or isinstance(fast, bool) or (_is_int(fast) and fast >= 0),
        "trainer.fast_dev_run",
        fast,
        "allowed: true, false, or a number of batches >= 0",
    )
    deterministic = t.get("deterministic")  # any other text ran as if true
    _need(
        deterministic is None or isinstance(deterministic, bool) or deterministic == "warn",
        "trainer.deterministic",
        deterministic,
        "allowed: true, false, warn",
    )
    benchmark = t.get("benchmark")  # text would reach torch.backends.cudnn.benchmark
    _need(
        benchmark is None or isinstance(benchmark, bool), "trainer.benchmark", benchmark, "allowed: true, false, null"
    )
    clip = t.get("gradient_clip_val")
    _need(
        clip is None or (_is_number(clip) and clip >= 0),
        "trainer.gradient_clip_val",
        clip,
        "must be a number > 0, or null (or 0) for no clipping",
    )


def resolve_accumulation(cfg: DictConfig, world_size: int) -> int:
    """`parallel_batches` K spreads K micro-batches per update over the workers: K / world_size each."""
    k, acc = cfg.get("parallel_batches"), cfg.trainer.get("accumulate_grad_batches")
    acc = 1 if acc is None else acc
    _need(_is_int(acc) and acc >= 1, "trainer.accumulate_grad_batches", acc, "must be an integer >= 1")
    if k is None:
        return acc
    _need(_is_int(k) and k >= 1, "parallel_batches", k, "must be an integer >= 1, or null")
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
