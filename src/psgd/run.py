"""One training run, end to end: check the config, build data/model/trainer, fit, test, write results.

Layout of a run directory (Hydra's output dir):
    metrics.json          summary (atomically rewritten after every epoch, final after the test)
    training_data.csv     time,val_accuracy per epoch (the workshop's format)
    tensorboard/          event files: training curves from the workers, hparams and test metrics
    checkpoints/last.ckpt the latest checkpoint
    .hydra/               the composed config and overrides
"""

import logging
import math
import os
import pickle
import random
import re
import socket
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext, suppress
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytorch_lightning as L
import torch
import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.callbacks import LearningRateMonitor, TQDMProgressBar
from pytorch_lightning.loggers import TensorBoardLogger
from pytorch_lightning.utilities.exceptions import MisconfigurationException
from torch import nn
from torch.multiprocessing import ProcessRaisedException
from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams as hparams_summary

from psgd import quietness, signals
from psgd.callbacks import (
    AtomicCheckpointIO,
    EpochCheckpoints,
    LatestCheckpoint,
    RunRecorder,
    ShardRecorder,
    TargetAccuracyStop,
    WeightRecorder,
    WorkerSetup,
)
from psgd.choices import INFO
from psgd.config import (
    GIVE,
    ConfigError,
    DirInUse,
    Plan,
    check,
    checkpoint_file,
    compile_mode,
    duration_s,
    model_arguments,
    schedule,
)
from psgd.console import first_worker, text_lines, warn
from psgd.data import ClassificationData
from psgd.data.datasets import DataError
from psgd.hooks import Trainer, skip_unused_hooks
from psgd.memory import memory_problem
from psgd.module import OPTIMIZER_KEY, STEP_IMPLEMENTATION, Classifier, fit_loop_state
from psgd.optim import scaled_lr, schedule_read
from psgd.outputs import earlier_results
from psgd.profiler import NoProfiler, PyTorchProfilerForWorkers
from psgd.results import (
    cpu_count,
    device_description,
    read_json,
    remove_temp_files,
    say,
    scales_by_workers,
    versions,
    write_json,
)
from psgd.strategies import HogwildStrategy, ModelAveragingStrategy
from psgd.strategies._lightning import (
    ReportsFirstFailure,
    defined_in_session,
    lost_a_peer,
    refuse_a_run_while_a_worker_imports_the_script,
    session_refusal,
)
from psgd.strategies.model_averaging import common_steps, optimizer_state_tensors

# the HParams tab's columns: each run's last value of these tags (a run without one, e.g. DDP's all-reduce
# wait in a HogWild run, shows it blank)
HPARAM_METRICS = (
    "test/acc",
    "test/loss",
    "val/acc",
    "val/loss",
    "time/samples_per_s",
    "time/cumulative_s",
    "ddp/allreduce_wait_ms",
    "averaging/time_s",
    "hogwild/staleness",
    "hogwild/lock_wait_s",
)


def build_model(model_cfg: DictConfig, data_name: str) -> tuple[nn.Module, int]:
    """Instantiate the network for this dataset; returns it and the image size it needs.

    A pairing that cannot work (e.g. a 28x28-only model on 32x32 CIFAR10) is a ConfigError (model_arguments).
    """
    cls, arguments, size = model_arguments(model_cfg, data_name)
    name, info = model_cfg.name, INFO[data_name]
    try:
        net = cls(**arguments)
    except TypeError as e:  # a setting the model has no argument for
        raise ConfigError(f"model={name}: {e}") from e
    except ValueError as e:  # a value the model refuses, named in its message
        raise ConfigError(str(e)) from e
    try:  # a dry forward pass catches any other shape mismatch now, not in a worker mid-run
        net.eval()
        with torch.no_grad():
            net(torch.zeros(2, info.channels, size, size))
        net.train()
    except RuntimeError as e:
        raise ConfigError(
            f"model={name} does not fit data={data_name} ({info.channels}x{size}x{size}): {str(e).splitlines()[0]}"
        ) from e
    return net, size


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


@contextmanager
def rendezvous_port():
    """A random free port for the workers' rendezvous while fit runs, unless the user set MASTER_PORT.
    Lightning asks the kernel for one (bind to port 0), and two runs started at the same moment can be
    handed the same port; a random pick over 40k ports makes that practically impossible. The variable
    is removed afterwards, so that nothing started later (the next job of a sweep) inherits it."""
    if "MASTER_PORT" in os.environ:
        yield
        return
    rng = random.SystemRandom()
    for _ in range(100):
        port = rng.randint(20000, 60999)
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
        break
    else:  # nothing free in 100 tries: leave the choice to Lightning
        yield
        return
    os.environ["MASTER_PORT"] = str(port)
    try:
        yield
    finally:
        os.environ.pop("MASTER_PORT", None)


def init_elastic_process_group(plan: Plan, backend: str | None, timeout: timedelta) -> None:
    """Under torchrun, make the process group here, on a store prefix of its own per restart attempt.

    torchrun's agent keeps one TCPStore for the whole job and its restarted workers find it again
    (TORCHELASTIC_USE_AGENT_STORE). Process-group keys have the same names in every attempt, so a
    restarted worker could read the address a dead worker of the previous attempt published, and gloo
    then fails with "connection refused" (seen with static and c10d rendezvous, torch 2.14). The
    restart count (TORCHELASTIC_RESTART_COUNT) is the same on every worker of an attempt and names
    its prefix. Lightning then finds the process group made and uses it."""
    env = os.environ
    world_size = int(env.get("WORLD_SIZE", "1"))
    if world_size == 1 or dist.is_initialized():
        return
    rank = int(env["RANK"])
    agent_store = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(
        env["MASTER_ADDR"],
        int(env["MASTER_PORT"]),
        world_size,
        is_master=not agent_store and rank == 0,  # otherwise the agent serves it
        timeout=timeout,
        multi_tenant=True,
    )
    attempt = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    if plan.accelerator == "gpu":
        torch.cuda.set_device(int(env.get("LOCAL_RANK", "0")))
    dist.init_process_group(
        backend or ("nccl" if plan.accelerator == "gpu" else "gloo"),
        store=dist.PrefixStore(f"psgd/attempt{attempt}", store),
        rank=rank,
        world_size=world_size,
        timeout=timeout,
    )


def build_strategy(cfg: DictConfig, plan: Plan, run_dir: Path):
    s = cfg.strategy
    common = {
        "process_group_backend": s.backend,  # None: gloo on CPU, nccl on GPU
        "start_method": plan.start_method,
        "timeout": timedelta(seconds=s.timeout_s),
    }
    if plan.launcher != "psgd":
        # torchrun / srun started every worker: Lightning's subprocess launcher is the one that then
        # starts nothing (its spawn launcher would start `workers` more processes in each of them)
        common["start_method"] = "popen"
    if s.name == "model_averaging":
        return ModelAveragingStrategy(
            period=s.period,
            same_init=s.same_init,
            average_buffers=s.average_buffers,
            average_optimizer_state=s.average_optimizer_state,
            seed=cfg.seed,
            replica_dir=str(run_dir / "replicas") if s.save_replicas else None,
            **common,
        )
    if s.name == "hogwild":
        common.pop("start_method")  # always forkserver: see SharedMemoryLauncher
        return HogwildStrategy(lock=s.lock, **common)
    if plan.workers == 1 and cfg.trainer.num_nodes == 1 and not s.get("ddp_for_one_worker", False):
        return "auto"  # one process: no process group, nothing to all-reduce
    ddp_kwargs: dict[str, Any] = {"bucket_cap_mb": s.bucket_cap_mb} if s.get("bucket_cap_mb") is not None else {}
    return ReportsFirstFailure(  # Lightning's DDPStrategy; a failed run names the worker that failed first
        **common, find_unused_parameters=s.find_unused_parameters, gradient_as_bucket_view=True, **ddp_kwargs
    )


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


def flat_hparams(cfg: DictConfig) -> dict[str, Any]:
    """The config as TensorBoard hparams: dotted keys, scalars only; the lr schedule as the run trained with it."""
    out: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if not str(k).startswith("_"):
                    walk(v, f"{prefix}{k}.")
            return
        key = prefix[:-1]
        out[key] = node if isinstance(node, int | float | str | bool) else str(node)

    settings = OmegaConf.to_container(cfg, resolve=True)
    if isinstance(settings.get("scheduler"), dict):  # scheduler=none: a constant lr, whatever its keys say
        settings["scheduler"] = schedule(settings["scheduler"])
    walk(settings, "")
    return out


def class_tag(label: int, name: str) -> str:
    """A class's TensorBoard tag name: its label, then its name in letters, digits and underscores
    ('6_Shirt', '0_T_shirt_top'; MNIST's '0 - zero' is '0_zero')."""
    word = re.sub(r"\W+", "_", name).strip("_")
    if word.startswith(f"{label}_") or word == str(label):
        return word
    return f"{label}_{word}" if word else str(label)


def write_tensorboard_summary(log_dir: Path, cfg: DictConfig, metrics: dict[str, Any], step: int) -> None:
    """hparams for the HParams tab (one run per job) plus the final test metrics, each class's
    accuracy as test/acc_class/<label>_<name> (test/acc_class/6_Shirt)."""
    final = {"test/acc": metrics.get("test_acc"), "test/loss": metrics.get("test_loss")}
    names = metrics.get("test_classes") or []
    for c, acc in enumerate(metrics.get("test_acc_per_class") or []):
        final[f"test/acc_class/{class_tag(c, names[c] if c < len(names) else '')}"] = acc
    writer = SummaryWriter(log_dir=str(log_dir))
    try:
        for key, value in final.items():
            if value is not None:
                writer.add_scalar(key, value, step)
        exp, ssi, sei = hparams_summary(flat_hparams(cfg), {k: 0.0 for k in HPARAM_METRICS})
        for summary in (exp, ssi, sei):
            writer.file_writer.add_summary(summary)
    finally:
        writer.close()


@contextmanager
def _quiet_lightning_banner():
    """The second (test) Trainer would repeat the 'GPU available' lines already printed for fit."""
    log = logging.getLogger("pytorch_lightning.utilities.rank_zero")
    level = log.level
    log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        log.setLevel(level)


def resolve_ckpt_path(
    value: str | None,
    module: Classifier,
    world_size: int = 1,
    strategy: str | None = None,
    max_time: Any = None,
    max_steps: Any = None,
) -> str | None:
    """The checkpoint to resume from, checked against the model, the lr schedule and (for a checkpoint
    that holds each worker's own state) the number of workers this run has and its `strategy` name
    (None: not checked). A run with nothing left to train (trainer.max_epochs, `max_time`, `max_steps`) says so."""
    if value is None:
        return None
    path = checkpoint_file("ckpt_path", value)
    checkpoint = load_weights_only("ckpt_path", value, path)
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("state_dict"), dict):
        raise ConfigError(f"ckpt_path={value!r} is not a psgd checkpoint (it holds no state_dict)")
    with naming_its_overrides(path):
        _check_resumable(value, checkpoint, module, world_size, strategy)
    line = nothing_left(checkpoint, module, max_time, max_steps)
    if line and first_worker():  # torchrun / srun: every worker finds it; the first says it
        print(f"psgd: ckpt_path={value} {line}", flush=True)
    return str(path)


def its_overrides(checkpoint: Path) -> str | None:
    """The command line's overrides of the run whose checkpoint this is (<run>/checkpoints/<name>.ckpt,
    Hydra's <run>/.hydra/overrides.yaml), as `key=value ...` for train.py; "" for
    none (its defaults), None where the file is not a run's."""
    saved = checkpoint.parent.parent / ".hydra" / "overrides.yaml"
    if checkpoint.parent.name != "checkpoints" or not saved.is_file():
        return None
    try:
        overrides = OmegaConf.to_container(OmegaConf.load(saved))
    except Exception:  # not Hydra's list: nothing to say
        return None
    if not isinstance(overrides, list):
        return None
    # not Hydra's own, nor the ckpt_path that run resumed from, nor a sweep's continue_sweep (not train.py's)
    left_out = ("hydra.", "hydra/", "ckpt_path=", "continue_sweep=")
    return " ".join(str(o) for o in overrides if not str(o).startswith(left_out))


@contextmanager
def naming_its_overrides(checkpoint: Path) -> Iterator[None]:
    """A checkpoint this run cannot resume: its line ends with the overrides that run was given (the
    same ones resume it), where its run dir says them."""
    try:
        yield
    except ConfigError as e:
        given = its_overrides(checkpoint)
        if given is None:
            raise
        said = f"that run's overrides: {given}" if given else "that run had no overrides"
        raise ConfigError(f"{e} ({said})") from None


def _check_resumable(
    value: str, checkpoint: dict[str, Any], module: Classifier, world_size: int, strategy: str | None
) -> None:
    """A ConfigError where resuming `checkpoint` would not be the run this one's settings ask for: another
    model, worker count, strategy, dataset, validation samples, partition, lr schedule or optimizer."""
    check_fits("ckpt_path", value, checkpoint["state_dict"], module.state_dict())
    replicas = checkpoint.get("replicas")  # model averaging / HogWild mid-run: one state per worker
    if replicas and not checkpoint.get("averaged") and len(replicas) != world_size:
        raise ConfigError(
            f"ckpt_path={value!r} holds {len(replicas)} workers' own state but this run has {world_size} "
            f"worker{'' if world_size == 1 else 's'}; resume with workers={len(replicas)}"
        )
    own_weights = replicas and not checkpoint.get("averaged") and "state_dict" in (replicas[0] or {})
    if own_weights and strategy is not None and strategy != "model_averaging":
        raise ConfigError(
            f"ckpt_path={value!r} holds {len(replicas)} replicas that model averaging had not averaged yet, and "
            f"strategy={strategy} would go on from worker 0's alone: resume with strategy=model_averaging (or "
            "from the run's final checkpoint, which holds their average)"
        )
    hparams = checkpoint.get("hyper_parameters") or {}  # the Classifier's, as the checkpoint's run had them
    trained_on, now_on = hparams.get("dataset"), module.hparams.get("dataset")
    if trained_on and now_on and trained_on != now_on:  # same image size and classes: the shapes fit
        raise ConfigError(
            f"ckpt_path={value!r} was trained on data={trained_on} and this run's data is {now_on}: resuming "
            f"would go on with its epochs, optimizer and schedule on other data; resume with data={trained_on}"
        )
    if "holdout" in hparams and hparams["holdout"] != module.hparams.get("holdout"):  # older ones: not kept
        held, now = hparams["holdout"], module.hparams.get("holdout")
        raise ConfigError(
            f"ckpt_path={value!r} held out {_holdout_text(held)} for validation and this run holds out "
            f"{_holdout_text(now)}: it would validate on samples the checkpoint trained on, or train on its "
            f"validation samples; resume with {_holdout_setting(held)}"
        )
    dealt, dealing = hparams.get("shards"), module.hparams.get("shards")  # None: not kept (older, or in code)
    if dealt is not None and dealing is not None and dealt != dealing:
        before, now = " ".join(dealt), " ".join(dealing)
        raise ConfigError(
            f"ckpt_path={value!r} dealt the samples to its workers with {before} and this run with {now}: "
            f"each worker would go on with other samples than its run gave it; resume with {before}"
        )
    problem = schedule_change(hparams, dict(module.hparams))
    problem = problem or optimizer_change(checkpoint, module)
    if problem:
        raise ConfigError(
            f"ckpt_path={value!r} cannot be resumed with {problem}: resuming restores its optimizer and lr "
            "schedule as they were, which would not follow this change; resume with the checkpoint's settings "
            f"(or start a new run from its weights with init_weights={value}, leaving ckpt_path out)"
        )


def nothing_left(checkpoint: dict[str, Any], module: Classifier, max_time: Any, max_steps: Any) -> str | None:
    """What the checkpoint already trained up to a limit of this run (trainer.max_epochs, max_time,
    max_steps), as `already trained 3 epoch(s), trainer.max_epochs=3: nothing is left to train; ...`; None
    while something is left."""
    done = "nothing is left to train; its final weights are tested"
    trained = fit_loop_state(checkpoint).get("epoch_progress", {})
    trained = trained.get("current", {}).get("processed")  # epochs whose training ended (Lightning's count)
    max_epochs = dict(getattr(module, "hparams", {})).get("max_epochs")
    if isinstance(trained, int) and isinstance(max_epochs, int) and trained >= max_epochs:
        return f"already trained {trained} epoch(s), trainer.max_epochs={max_epochs}: {done}"
    if max_time is not None:  # Lightning's Timer counts the whole run, resumes included: it stopped at once
        timer = (checkpoint.get("callbacks") or {}).get("Timer") or {}
        elapsed, limit = (timer.get("time_elapsed") or {}).get("train"), duration_s(max_time)
        if isinstance(elapsed, int | float) and limit is not None and elapsed >= limit:
            return (
                f"already trained for {elapsed:.0f} s, trainer.max_time={max_time}: nothing is left to train (max_time "
                "counts the whole run, resumes included: a longer one trains on); its final weights are tested"
            )
    steps = checkpoint.get("global_step")  # optimizer steps taken (each worker's; max_steps is DDP's or one worker's)
    if isinstance(max_steps, int) and max_steps > 0 and isinstance(steps, int) and steps >= max_steps:
        return f"already took {steps} steps, trainer.max_steps={max_steps}: {done}"
    return None


def load_weights_only(setting: str, value: str, path: Path) -> Any:
    """torch.load with weights only: a checkpoint is data, never code."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ConfigError(
            f"{setting}={value!r} is not a psgd checkpoint loadable as weights only "
            f"({type(e).__name__}: {str(e).splitlines()[0][:120]})"
        ) from e


def check_fits(setting: str, value: str, saved: dict[str, Any], expected: dict[str, torch.Tensor]) -> None:
    """Every weight of this run's model, in its shape, and no other: else a ConfigError naming one."""
    for key, tensor in expected.items():
        found = saved.get(key)
        if not isinstance(found, torch.Tensor) or found.shape != tensor.shape:
            what = "missing" if key not in saved else f"shape {tuple(getattr(found, 'shape', ()))}"
            raise ConfigError(
                f"{setting}={value!r} does not fit this run's model: {key} is {what} in the checkpoint, "
                f"the model needs {tuple(tensor.shape)} (was it saved with another model= or data=?)"
            )
    unexpected = sorted(set(saved) - set(expected))
    if unexpected:
        raise ConfigError(
            f"{setting}={value!r} does not fit this run's model: the checkpoint has extra "
            f"weights such as {unexpected[0]} (was it saved with another model= or data=?)"
        )


def init_weights(value: str | None, module: Classifier) -> str | None:
    """init_weights: the run starts from an earlier run's weights (its run dir or a .ckpt: the weights it
    ended with, or had at that checkpoint; a worker's weights/rank<r>.pt of record_weights; or the
    state_dict of the same network saved with torch.save) and trains them with its own epochs,
    optimizer and lr schedule. Loaded into `module`; returns the file, or None without one."""
    if value is None:
        return None
    give = GIVE["init_weights"]
    path = checkpoint_file("init_weights", value)
    loaded = load_weights_only("init_weights", value, path)
    if isinstance(loaded, dict) and isinstance(loaded.get("state_dict"), dict):  # a (psgd) Lightning checkpoint
        replicas = loaded.get("replicas")
        if replicas and not loaded.get("averaged") and "state_dict" in (replicas[0] or {}):
            raise ConfigError(
                f"init_weights={value!r} holds {len(replicas)} replicas that model averaging had not averaged "
                "yet: give the finished run (its final checkpoint holds their average) or one worker's "
                "weights/rank<r>.pt (record_weights=true)"
            )
        loaded = loaded["state_dict"]
    if not isinstance(loaded, dict) or not loaded or not all(isinstance(v, torch.Tensor) for v in loaded.values()):
        raise ConfigError(f"init_weights={value!r} holds no weights (a checkpoint or a state_dict of tensors); {give}")
    if not any(k.startswith("net.") for k in loaded):  # a plain network's state_dict: psgd's module holds it as net
        loaded = {f"net.{k}": v for k, v in loaded.items()}
    with naming_its_overrides(path):  # model=mlp among them, say
        check_fits("init_weights", value, loaded, module.state_dict())
    module.load_state_dict(loaded)
    return str(path)


def shard_settings(cfg: DictConfig) -> list[str]:
    """The settings that decide which samples each worker trains on, as `key=value` texts: the
    partition, its sizes or Dirichlet alpha, and the seed where it fixes the membership (sizes,
    dirichlet; iid shards are dealt anew every epoch, by_label by label)."""
    d = cfg.data
    settings = [f"data.partition={d.partition}"]
    if d.partition == "sizes":
        settings += [f"data.partition_sizes=[{','.join(f'{x:g}' for x in d.partition_sizes)}]", f"seed={cfg.seed}"]
    elif d.partition == "dirichlet":
        settings += [f"data.dirichlet_alpha={d.dirichlet_alpha:g}", f"seed={cfg.seed}"]
    return settings


def _holdout_text(holdout: list | None) -> str:
    if not holdout:
        return "nothing (data.val_split=0)"
    return f"data.val_split={holdout[0]:g} drawn with seed={holdout[1]}"


def _holdout_setting(holdout: list | None) -> str:
    return "data.val_split=0" if not holdout else f"data.val_split={holdout[0]:g} seed={holdout[1]}"


def _all_workers(hparams: dict[str, Any]) -> int:
    """The workers of all nodes (a checkpoint from before num_nodes was kept: one node)."""
    return hparams["workers"] * (hparams.get("num_nodes") or 1)


def _workers_said(hparams: dict[str, Any]) -> str:
    nodes = hparams.get("num_nodes") or 1
    return f"workers={hparams['workers']}" + (f" x trainer.num_nodes={nodes}" if nodes > 1 else "")


def schedule_change(saved: dict[str, Any], now: dict[str, Any]) -> str | None:
    """What of the lr and its schedule this run changes from the checkpoint's run (hyper-parameters
    of the Classifier), as `key=new (the checkpoint's run had old)`, or None. The lr and every
    scheduler setting count; trainer.max_epochs counts under a cosine decay, whose horizon it is
    (resuming a 1-epoch cosine run with max_epochs=2 trained the extra epoch at lr 0); workers counts
    under a warm-up whose start factor is the default 1/workers."""
    if not saved:  # not written by psgd's Classifier: nothing to compare
        return None
    old_s, new_s = schedule_read(saved.get("scheduler")), schedule_read(now.get("scheduler"))
    if "lr" in saved and not math.isclose(saved["lr"], now["lr"], rel_tol=1e-9):
        return f"lr {now['lr']:g} (optimizer.lr x lr_scaling; the checkpoint's run had {saved['lr']:g})"
    for key in sorted(set(old_s) | set(new_s)):
        if old_s.get(key) != new_s.get(key):
            return f"scheduler.{key}={new_s.get(key)} (the checkpoint's run had {old_s.get(key)})"
    warming_up = (new_s.get("warmup_epochs") or 0) > 0 and new_s.get("start_factor") is None
    if warming_up and saved.get("workers") is not None and _all_workers(saved) != _all_workers(now):
        return (
            f"{_workers_said(now)} under a warm-up from 1/workers of the lr "
            f"(the checkpoint's run had {_workers_said(saved)}: its warm-up starts at lr/{_all_workers(saved)})"
        )
    if new_s.get("decay") == "cosine" and saved.get("max_epochs") not in (None, now["max_epochs"]):
        return (
            f"trainer.max_epochs={now['max_epochs']} under a cosine decay "
            f"(the checkpoint's run had {saved['max_epochs']}: its cosine reaches lr 0 there)"
        )
    return None


# param-group entries that are not the optimizer's settings: the parameters, the lr (the schedule's, checked
# by schedule_change) and how torch runs the step (the resumed run's own: Classifier._update_as_configured)
_NOT_SETTINGS = {"params", "lr", "initial_lr", *STEP_IMPLEMENTATION}


def optimizer_change(checkpoint: dict[str, Any], module: Classifier) -> str | None:
    """What of the optimizer this run changes from the checkpoint's run, or None. Lightning restores the
    checkpoint's optimizer state with its param groups, settings included: a resume with
    optimizer.momentum=0 went on with the checkpoint's 0.9, silently, and one with another optimizer=
    failed in its first step (KeyError: 'exp_avg'). Compared: the optimizer's class (kept in psgd's
    checkpoints; for older ones, settings each side lacks) and every setting of every param group."""
    states = checkpoint.get("optimizer_states")
    if not states:
        return None
    fresh = module.build_optimizer()  # no state yet: only its settings are read
    name, old_name = type(fresh).__name__, checkpoint.get(OPTIMIZER_KEY)
    if old_name is not None and old_name != name:
        return f"optimizer {name} (the checkpoint's run used {old_name})"
    old_groups, new_groups = states[0].get("param_groups") or [], fresh.param_groups
    if len(old_groups) != len(new_groups):
        return f"{len(new_groups)} optimizer parameter groups (the checkpoint's run had {len(old_groups)})"

    def plain(v: Any) -> Any:
        return [plain(x) for x in v] if isinstance(v, list | tuple) else v

    def shown(v: Any) -> str:  # as written on the command line: true, [0.9, 0.99]
        v = plain(v)
        return str(v).lower() if isinstance(v, bool) or v is None else str(v)

    def same(a: Any, b: Any) -> bool:
        a, b = plain(a), plain(b)
        if isinstance(a, list) and isinstance(b, list):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (a, b))
        if not numbers:
            return a == b
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15)

    for i, (old, new) in enumerate(zip(old_groups, new_groups)):
        old_keys, new_keys = set(old) - _NOT_SETTINGS, set(new) - _NOT_SETTINGS
        # a newer torch may add a setting to the same optimizer; another optimizer lacks some of each other's
        if old_name is None and new_keys - old_keys and old_keys - new_keys:
            return (
                f"optimizer {name} (the checkpoint's optimizer has no {sorted(new_keys - old_keys)[0]} "
                f"but a {sorted(old_keys - new_keys)[0]}: another optimizer)"
            )
        for key in sorted(old_keys & new_keys):
            if not same(old[key], new[key]):
                # a model that sets this value per group names the setting it comes from (the MLP's decay)
                names = getattr(module.net, "group_settings", {}).get(key)
                if names and names[i]:
                    return f"{names[i]}={shown(new[key])} (the checkpoint's run had {shown(old[key])})"
                where = f" in its parameter group {i}" if len(new_groups) > 1 else ""
                return f"optimizer.{key}={shown(new[key])}{where} (the checkpoint's run had {shown(old[key])})"
    return None


def elastic_resume(ckpt_path: str | None, plan: Plan, run_dir: Path, continued: bool = False) -> str | None:
    """torchrun --max-restarts restarts every worker after one died: continue from the run's last
    checkpoint instead of starting over (the run dir is the same: see psgd.run_name). So does a job of a
    continued sweep (`continued`), whose own checkpoint supersedes the ckpt_path it started from."""
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    last = run_dir / "checkpoints" / "last.ckpt"
    if continued and last.exists():
        say(f"psgd: job {run_dir.name} goes on from its {last}")
        return str(last)
    if ckpt_path is None and plan.launcher == "torchrun" and restarts > 0 and last.exists():
        if os.environ.get("RANK") == "0":
            say(f"psgd: restart {restarts}: resuming from {last}")
        return str(last)
    return ckpt_path


def mark_status(record_path: Path, status: str, create: bool = False, **fields: Any) -> dict[str, Any] | None:
    """Mark the on-disk record of a run that stopped early, keeping its finished epochs; with `create`
    a run that never wrote one gets a record of its own (a failed sweep job, for the report). Returns
    the record as written, or None where there was none to mark."""
    if not (record_path.exists() or create):
        return None
    record = read_json(record_path) if record_path.exists() else {}
    record.update(status=status, **fields)
    write_json(record_path, record)
    return record


def raised_in_worker(e: BaseException, classes: tuple[type, ...]) -> str | None:
    """The message of an error of one of `classes` that a worker raised (`e` a ProcessRaisedException,
    whose last traceback line is `<module>.<class>: <message>`), or None."""
    if not isinstance(e, ProcessRaisedException):
        return None
    last = text_lines(e)[-1]
    for c in classes:
        prefix = f"{c.__module__}.{c.__qualname__}: "
        if last.startswith(prefix):
            return last[len(prefix) :]
    return None


def lightning_refusal(e: BaseException) -> str | None:
    """The message of a MisconfigurationException Lightning raised inside fit, here or in a worker
    (a value it checks only once it has the data, e.g. trainer.limit_val_batches=0.01 of 4 batches),
    or of the ValueError it raises there for a trainer.val_check_interval of more batches than an epoch has."""
    if isinstance(e, MisconfigurationException):
        return " ".join(text_lines(e))
    if isinstance(e, ProcessRaisedException):
        last = text_lines(e)[-1]
        message = last.removeprefix("ValueError:").strip()
        if message != last and message.startswith(_VAL_CHECK_REFUSAL):
            return message
        return raised_in_worker(e, (MisconfigurationException,))
    if isinstance(e, ValueError) and str(e).strip().startswith(_VAL_CHECK_REFUSAL):
        return " ".join(text_lines(e))
    return None


_VAL_CHECK_REFUSAL = "`val_check_interval` ("  # Lightning's fit loop, once it knows the epoch's batches


class WorkerGone(RuntimeError):
    """Under torchrun: workers on this machine ended without an error of their own (a signal such as the
    OOM killer's SIGKILL, a crash) while this one trained; torchrun's agent then stopped the others with
    SIGTERM, or this one's collective lost them first. str() is the line a user sees. `says_so`: this
    worker prints it (the lowest rank on this machine that did not die, so the line comes once);
    `records`: it also marks metrics.json failed (rank 0, or the one saying so where rank 0 died)."""

    def __init__(self, ranks: list[int], survivors: list[int], run_dir: Path, oom_kills: int):
        rank, self.ranks = int(os.environ.get("RANK", "0")), ranks
        self.says_so = rank == survivors[0]
        self.records = rank == 0 or (0 in ranks and self.says_so)
        which = f"worker rank {ranks[0]}" if len(ranks) == 1 else f"worker ranks {', '.join(map(str, ranks))}"
        if oom_kills > 0:
            why = (
                f"killed by the kernel's out-of-memory killer (its OOM-kill count rose by {oom_kills} during the "
                "run): use fewer workers per machine or a smaller data.batch_size"
            )
        else:
            why = "the process ended without an error of its own: a signal or a crash; torchrun's summary says which"
        super().__init__(f"{which} died ({why}); results of finished epochs are in {run_dir}")


def torchrun_worker_gone(e: BaseException, run_dir: Path) -> WorkerGone | None:
    """Why a torchrun worker's fit stopped with `e`, when a worker on this machine died without a word:
    `e` is the interrupt of the agent's SIGTERM that followed, or this worker's collective losing its
    peer. A peer's sockets close as it dies, a moment before its process is seen gone: that case looks
    again for up to a second. None when no worker here died that way (a user's SIGTERM or Ctrl-C, a
    worker's own error, which it reports itself, or a worker on another machine)."""
    signalled = isinstance(e, KeyboardInterrupt | SystemExit) and signals.received == "SIGTERM"
    lost = isinstance(e, RuntimeError) and lost_a_peer(text_lines(e)[-1])
    if not (signalled or lost):
        return None
    deadline = time.monotonic() + (1.0 if lost else 0.0)
    gone, survivors = signals.torchrun_workers_gone()
    while not gone and time.monotonic() < deadline:
        time.sleep(0.05)
        gone, survivors = signals.torchrun_workers_gone()
    if not gone:
        return None
    return WorkerGone(gone, survivors, run_dir, signals.oom_kills_since(signals.oom_kills_at_mark))


def mark_stopped(run_dir: Path, e: BaseException, launched: bool = False) -> None:
    """Mark a run that `e` stopped: interrupted (Ctrl-C, SIGTERM: one line says so) or failed. Its
    finished epochs stay in metrics.json. `launched`: psgd's launcher started the run's workers here,
    as this process's children."""
    interrupted = isinstance(e, KeyboardInterrupt | SystemExit)  # Lightning turns Ctrl-C into exit(1)
    if interrupted:
        # the workers got the signal too (psgd.signals): let them end before this write, none left behind
        signals.wind_down_children()
        if launched:  # such a worker dies at once by the signal: one ended in the middle of a write left that
            # write's temp file. (torchrun's or srun's workers clean up their own and may still be writing.)
            remove_temp_files(run_dir)
    # every worker has stopped by now, so nothing races this write
    record = None
    with suppress(OSError):  # best effort: on a full disk the mark cannot be written, and `e` is what to report
        record = mark_status(run_dir / "metrics.json", "interrupted" if interrupted else "failed")
    if interrupted:
        how = f" ({signals.received})" if signals.received else ""
        finished = (record or {}).get("epochs", 0)
        kept = f"finished epochs are kept in {run_dir}" if finished else f"no epoch had finished ({run_dir})"
        say(f"psgd: interrupted{how}; {kept}")


def exit_if_interrupted(e: BaseException) -> None:
    """After mark_stopped: a run that Ctrl-C or SIGTERM stopped exits as a shell reports the signal, 130
    or 143, as it does when stopped before training (Lightning turns either into exit code 1 inside fit,
    which a script could not tell from a failed run). Called from Python rather than by the scripts (a
    notebook, a script of the user's: Hydra has not set the job up), it raises Ctrl-C's own exception,
    KeyboardInterrupt: a notebook's interrupt showed "SystemExit: 130" and IPython's "To exit: use
    'exit', 'quit', or Ctrl-D", and a caller's `except KeyboardInterrupt` did not catch it."""
    if isinstance(e, KeyboardInterrupt | SystemExit):
        if not HydraConfig.initialized():
            raise KeyboardInterrupt(*([signals.received] if signals.received else [])) from None
        raise SystemExit(signals.interrupted_exit_code()) from None


# trainer.* keys whose null Lightning takes as a setting of its own, not as its default: every other null
# is left out of Trainer(...), so that Lightning's default stands. check_val_every_n_epoch=None validates
# every val_check_interval batches counted across epochs (its default, 1, refuses an interval longer
# than an epoch, advising None)
NULL_IS_A_SETTING = ("check_val_every_n_epoch",)


@contextmanager
def found_by_every_worker() -> Iterator[None]:
    """A bad value or bad data found inside follows from the config, the machine and its files alone:
    under torchrun every worker of a machine finds the same, and only its first says it
    (psgd.command_line.fail; each used to print the same line)."""
    try:
        yield
    except (ConfigError, DataError) as e:
        e.every_worker_finds_it = True
        raise


def run_dir_key() -> str:
    """What a user sets to choose the run dir: train()'s argument, or Hydra's key when Hydra runs it."""
    if not HydraConfig.initialized():
        return "run_dir"
    return "hydra.sweep.dir" if HydraConfig.get().mode == RunMode.MULTIRUN else "hydra.run.dir"


def train(
    cfg: DictConfig, run_dir: str | Path, callbacks: Sequence[L.Callback] = (), continued: bool = False
) -> dict[str, Any] | None:
    """Run one configured training job in `run_dir`; returns the final metrics (also in metrics.json).

    `callbacks`: Lightning callbacks of the caller's, added to the training Trainer after psgd's own
    (with workers > 1 they are pickled into every worker process).

    Under torchrun / srun (one process per worker) only global rank 0 tests and returns metrics; the
    other workers return None.

    A `run_dir` that holds an earlier run's metrics.json is refused (DirInUse) before anything is
    written into it, unless torchrun restarted this job's workers (they go on in their own dir) or the
    job is one of a `continued` sweep (psgd.cli.continue_job has cleared its dir of a completed or
    unresumable attempt): both resume from the run dir's checkpoints/last.ckpt where it has one.
    """
    refuse_a_run_while_a_worker_imports_the_script()
    with found_by_every_worker():  # the config and the machine decide it
        plan = check(cfg)
    in_use = None if continued else earlier_results(Path(run_dir), run_dir_key())
    if in_use:
        raise DirInUse(in_use)
    with quietness(bool(cfg.get("quiet"))):
        return _train(cfg, Path(run_dir), plan, list(callbacks), continued)


def micro_batches_per_update(plan: Plan, num_nodes: int, synchronous: bool) -> int:
    """The batches one optimizer update averages: DDP's averages every worker's (on every node); a
    model-averaging or HogWild worker updates with its own alone. Each accumulates its share."""
    return (plan.workers * num_nodes if synchronous else 1) * plan.accumulate_grad_batches


def _check_picklable(callbacks: list[L.Callback], net: torch.nn.Module) -> None:
    """The caller's callbacks go to every worker process pickled: one that cannot be failed as the
    workers started, with pickle's message naming neither the callback nor why it was pickled. In a
    notebook, a callback or model class of the session's own is refused too (defined_in_session)."""
    named = [(f"callbacks[{i}] ({type(c).__name__})", c) for i, c in enumerate(callbacks)]
    for what, callback in named:
        try:
            pickle.dumps(callback)
        except Exception as e:
            raise TypeError(
                f"{what} cannot be pickled ({e}), and each worker process gets the callbacks pickled: make it "
                "picklable (a class defined at a module's top level, without locks, open files or lambdas in its "
                "attributes), or run one worker (workers=1, strategy=ddp) in this process"
            ) from e
    for what, obj in [*named, ("the model", net)]:
        name = defined_in_session(obj)
        if name:
            raise TypeError(session_refusal(obj, name, what))


def _train(
    cfg: DictConfig, run_dir: Path, plan: Plan, extra_callbacks: list[L.Callback], continued: bool = False
) -> dict[str, Any] | None:
    if plan.launcher == "torchrun":
        signals.stop_with_agent()  # an agent killed outright (OOM, kill -9) left its workers training on
        signals.mark_running_under_torchrun()  # so that a worker that dies without a word can be named
    quiet = bool(cfg.get("quiet"))
    bars = not quiet and sys.stdout.isatty()  # into a file or pipe (SLURM, CI, `> log`): a line per epoch instead
    L.seed_everything(cfg.seed, workers=True, verbose=False)  # before the model: same seed, same init
    t = cfg.trainer
    world_size = plan.workers * t.num_nodes  # the workers of all nodes
    net, image_size = build_model(cfg.model, cfg.data.name)
    warn_if_nothing_to_average(cfg, net, world_size)

    synchronous = cfg.strategy.name == "ddp"
    one_model = cfg.strategy.name in ("ddp", "hogwild")  # every worker evaluates the same weights
    datamodule = build_datamodule(cfg, image_size)
    with found_by_every_worker():
        datamodule.prepare_data()  # a missing dataset fails here, before any worker starts
        if short := check_data(cfg, datamodule, world_size):  # so does a worker without a batch
            warn(short)  # a shard smaller than one batch
        sizes, batches = datamodule.train_shards(world_size)
        if plan.accelerator == "cpu" and plan.launcher == "psgd":  # every worker on this machine
            check_memory(cfg, net, image_size, sizes, plan.workers)
        warn_if_lockstep_leaves_samples_out(cfg, sizes, batches)
        warn_if_an_epoch_holds_less_than_an_update(cfg, batches, plan.accumulate_grad_batches)
        warn_if_period_never_comes(cfg, batches, plan.accumulate_grad_batches)

    lr = scaled_lr(
        cfg.optimizer.lr,
        world_size,
        cfg.lr_scaling,
        samples_per_update=cfg.data.batch_size * micro_batches_per_update(plan, t.num_nodes, synchronous),
        reference_batch=cfg.get("lr_reference_batch"),
    )
    info = INFO[cfg.data.name]
    lr_schedule = schedule(OmegaConf.to_container(cfg.scheduler, resolve=True))  # scheduler=none: a constant lr
    module = Classifier(
        net,
        # plain lists, not OmegaConf's ListConfig (NovoGrad's betas): the optimizer's state_dict keeps
        # them, and a checkpoint holding a ListConfig does not load with weights_only=True (no resume)
        instantiate(cfg.optimizer, _convert_="all"),
        lr=lr,
        workers=plan.workers,
        max_epochs=t.max_epochs,
        scheduler=lr_schedule,
        num_classes=info.num_classes,
        channels_last=cfg.channels_last,
        per_worker_metrics=not one_model,
        input_shape=(info.channels, image_size, image_size),
        dataset=cfg.data.name,  # kept in its checkpoints: a resume on another dataset is refused
        # the validation samples held out of the training set ([data.val_split, seed], which draws them),
        # kept too: a resume holding out others would validate on samples the checkpoint trained on
        holdout=[cfg.data.val_split, cfg.seed] if cfg.data.val_split else None,
        shards=shard_settings(cfg),  # how samples are dealt to the workers: a resume must deal them alike
        num_nodes=t.num_nodes,
        optimizer_lr=cfg.optimizer.lr,
        lr_by_workers=scales_by_workers(cfg),
        compile=compile_mode(cfg.get("compile")),
    )
    with found_by_every_worker():
        # the weights of an earlier run to start from (a resume below, ckpt_path, restores its own over them)
        started_from = init_weights(cfg.get("init_weights"), module)
        ckpt_path = resolve_ckpt_path(
            elastic_resume(cfg.get("ckpt_path"), plan, run_dir, continued),
            module,
            world_size,
            cfg.strategy.name,
            max_time=t.get("max_time"),
            max_steps=t.get("max_steps"),
        )
    strategy = build_strategy(cfg, plan, run_dir)
    if plan.launcher == "psgd" and not isinstance(strategy, str):  # psgd starts worker processes
        _check_picklable(extra_callbacks, net)
    run_info = {
        "strategy": cfg.strategy.name,
        "workers": plan.workers,
        "world_size": world_size,
        "num_nodes": t.num_nodes,
        "threads_per_worker": plan.threads_per_worker,
        "launcher": plan.launcher,
        # how psgd started the worker processes (null: it started none, one worker or torchrun / srun)
        "start_method": plan.start_method if plan.launcher == "psgd" and world_size > 1 else None,
        # Lightning's name for plain DDP (psgd's subclass only changes how a failure is reported)
        "lightning_strategy": (
            strategy
            if isinstance(strategy, str)
            else "DDPStrategy"
            if type(strategy) is ReportsFirstFailure
            else type(strategy).__name__
        ),
        "model": cfg.model.name,
        "data": cfg.data.name,
        "partition": cfg.data.partition,
        "batch_size": cfg.data.batch_size,
        "precision": None,  # as Lightning runs it (16-mixed on CPU runs as bf16-mixed): set once it is known
        "accumulate_grad_batches": plan.accumulate_grad_batches,
        # micro-batches averaged per update: DDP's update averages every worker's; a model-averaging or
        # HogWild worker updates with its own alone
        "parallel_batches": micro_batches_per_update(plan, t.num_nodes, synchronous),
        "optimizer": cfg.optimizer._target_.rsplit(".", 1)[-1],
        "lr": lr,
        "lr_scaling": cfg.lr_scaling,
        "lr_reference_batch": cfg.get("lr_reference_batch"),
        "init_weights": started_from,
        # the checkpoint this run resumed from (ckpt_path, a restarted torchrun job's or a continued sweep
        # job's own last.ckpt): its history's earlier epochs were trained there, maybe with other settings
        "resumed_from": ckpt_path,
        "seed": cfg.seed,
        "device": device_description(plan.accelerator),
        "versions": versions(),
    }
    es = cfg.early_stop
    per_step_lr = schedule_read(lr_schedule).get("interval") == "step"  # (a constant lr has no steps to log)
    callbacks: list = [
        WorkerSetup(plan.threads_per_worker, cfg.seed, cfg.flush_denormal, step_logs=per_step_lr),
        RunRecorder(str(run_dir), run_info, es.target_acc, echo=not quiet and not bars),
        LatestCheckpoint(run_dir / "checkpoints"),  # first: it is trainer.checkpoint_callback
    ]
    if cfg.checkpoint_every_epoch:
        callbacks.append(EpochCheckpoints(run_dir / "checkpoints"))
    if es.target_acc is not None:
        callbacks.append(TargetAccuracyStop(es.target_acc, es.patience))
    if per_step_lr:
        # the lr of a per-step schedule every trainer.log_every_n_steps steps (tag lr_step; `lr` is each
        # epoch's start); a per-epoch schedule has no per-step hook at all
        callbacks.append(LearningRateMonitor(logging_interval="step"))
    if cfg.record_shards:
        callbacks.append(ShardRecorder(str(run_dir)))
    if cfg.get("record_weights"):
        callbacks.append(WeightRecorder(str(run_dir)))
    if bars:
        callbacks.append(TQDMProgressBar(refresh_rate=10))  # redrawing every step costs throughput
    callbacks += extra_callbacks
    logger = TensorBoardLogger(str(run_dir), name="tensorboard", version="", default_hp_metric=False)
    trainer_kwargs = {
        k: v for k, v in OmegaConf.to_container(t, resolve=True).items() if v is not None or k in NULL_IS_A_SETTING
    }
    trainer_kwargs.update(
        accelerator=plan.accelerator, devices=plan.workers, accumulate_grad_batches=plan.accumulate_grad_batches
    )
    trainer_kwargs.setdefault("profiler", NoProfiler())
    # checkpoints written atomically in their own folder; a +trainer.plugins of the user's stays
    plugins = trainer_kwargs.pop("plugins", [])
    trainer_kwargs["plugins"] = [*(plugins if isinstance(plugins, list) else [plugins]), AtomicCheckpointIO()]
    if trainer_kwargs["profiler"] == "pytorch":  # Lightning's own cannot be pickled into worker processes
        trainer_kwargs["profiler"] = PyTorchProfilerForWorkers()
    try:
        trainer = Trainer(
            **trainer_kwargs,
            strategy=strategy,
            callbacks=callbacks,
            logger=logger,
            use_distributed_sampler=False,  # the datamodule shards; Lightning must not shard a second time
            enable_progress_bar=bars,
            enable_model_summary=not quiet,
        )
    except (TypeError, ValueError, MisconfigurationException) as e:  # a trainer.* value Lightning refuses
        raise ConfigError(f"Lightning refuses a trainer setting: {' '.join(text_lines(e))}") from e
    run_info["precision"] = str(trainer.precision)
    skip_unused_hooks(trainer, module)  # ~250 Python calls less per training step (benchmarks/calls_per_step.py)
    try:
        if plan.launcher == "torchrun":  # where Lightning would make it, inside fit: same failure handling
            init_elastic_process_group(plan, cfg.strategy.backend, timedelta(seconds=cfg.strategy.timeout_s))
        launcher = plan.launcher == "psgd"
        with (
            rendezvous_port() if launcher else nullcontext(),
            signals.launching() if launcher else nullcontext(),
            signals.sigterm_interrupts(),
        ):
            trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
    except BaseException as e:
        gone = None
        if plan.launcher == "torchrun":
            # torchrun's agent SIGTERMs the workers once one failed: this one is on its way out, and says why first
            signals.ignore_sigterm()
            gone = torchrun_worker_gone(e, run_dir)
        if gone is not None:  # not an interrupt, not this worker's own failure: psgd.cli reports it
            raise gone from e
        if plan.launcher == "psgd" or trainer.global_rank == 0:  # torchrun / srun: each worker gets here, one says so
            mark_stopped(run_dir, e, launched=plan.launcher == "psgd")
        exit_if_interrupted(e)
        refused = lightning_refusal(e)
        if refused:
            raise ConfigError(f"Lightning refuses a setting: {refused}") from e
        raise

    try:  # Ctrl-C, SIGTERM in the test, or between fit and test and in the last writes (outside any run
        # handler: the scripts raise KeyboardInterrupt on either, psgd.signals.interrupt_on_sigterm)
        if plan.launcher != "psgd":  # torchrun / srun: every worker is a process like this one
            rank = trainer.global_rank
            if dist.is_initialized():  # the test below must not sync metrics with the other workers
                dist.barrier()
                dist.destroy_process_group()
            if rank != 0:
                return None
        # Test the final weights here, on one device: the workers have exited (spawn) or are this process.
        limits = {"limit_test_batches": t.limit_test_batches} if t.get("limit_test_batches") is not None else {}
        with _quiet_lightning_banner():
            test_trainer = Trainer(
                accelerator=plan.accelerator,
                devices=1,
                logger=False,
                callbacks=[WorkerSetup(cpu_count(), flush_denormal=cfg.flush_denormal)],
                enable_progress_bar=False,
                enable_model_summary=False,
                enable_checkpointing=False,
                fast_dev_run=t.fast_dev_run,
                precision=trainer.precision,  # as it ran (16-mixed: bf16-mixed on CPU, warned of once)
                **limits,
            )
        with signals.sigterm_interrupts():
            (tested,) = test_trainer.test(module, datamodule=datamodule, verbose=False)
        record_path = run_dir / "metrics.json"
        metrics = read_json(record_path) if record_path.exists() else callbacks[1].summary("trained")
        metrics.update(
            status="completed",
            test_acc=round(tested["test/acc"], 6),
            test_loss=round(tested["test/loss"], 6),
            test_acc_per_class=module.test_acc_per_class,
            test_classes=list(INFO[cfg.data.name].classes),
        )
        write_json(record_path, metrics)
        steps = metrics["history"][-1]["step"] if metrics["history"] else 0
        write_tensorboard_summary(run_dir / "tensorboard", cfg, metrics, steps)
    except (KeyboardInterrupt, SystemExit) as e:
        if plan.launcher == "psgd" or trainer.global_rank == 0:  # torchrun / srun: one writer, one line
            mark_stopped(run_dir, e)
        exit_if_interrupted(e)  # (always raises here)
    return metrics
