"""One training run, end to end: check the config, build data/model/trainer, fit, test, write results.

Layout of a run directory (Hydra's output dir):
    metrics.json          summary (atomically rewritten after every epoch, final after the test)
    training_data.csv     time,val_accuracy per epoch (the workshop's format)
    tensorboard/          event files: training curves from the workers, hparams and test metrics
    checkpoints/last.ckpt the latest checkpoint
    .hydra/               the composed config and overrides
"""

import logging
import pickle
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
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

from psgd import signals, torchrun
from psgd.advice import scales_by_workers
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
    ConfigError,
    DirInUse,
    Plan,
    build_model,
    check,
    compile_mode,
    schedule,
)
from psgd.console import text_lines, warn
from psgd.data import ClassificationData
from psgd.data.datasets import DataError
from psgd.environment import cpu_count, device_description, versions
from psgd.io import read_json, write_json
from psgd.module import Classifier
from psgd.optim import scaled_lr, schedule_read
from psgd.outputs import earlier_results
from psgd.process import run_settings
from psgd.profiler import PyTorchProfilerForWorkers
from psgd.rendezvous import init_elastic_process_group, rendezvous_port
from psgd.resume import elastic_resume, init_weights, resolve_ckpt_path, shard_settings
from psgd.run_checks import build_datamodule, check_data, check_memory
from psgd.stopped import exit_if_interrupted, lightning_refusal, mark_stopped, torchrun_worker_gone
from psgd.strategies import HogwildStrategy, ModelAveragingStrategy
from psgd.strategies.ddp import ReportsFirstFailure
from psgd.strategies.workers import defined_in_session, refuse_a_run_while_a_worker_imports_the_script, session_refusal
from psgd.summary import write_tensorboard_summary


def build_strategy(cfg: DictConfig, plan: Plan, run_dir: Path) -> Any:
    """Lightning's strategy for strategy.*: psgd's model averaging or HogWild, DDP, or "auto" for one process."""
    s = cfg.strategy
    common = {
        "process_group_backend": s.backend,  # None: gloo on CPU, nccl on GPU
        "start_method": plan.start_method,
        "timeout": timedelta(seconds=s.timeout_s),
    }
    if plan.launcher != "psgd":  # torchrun / srun started every worker: Lightning's popen launcher starts none
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


# trainer.* keys whose null Lightning takes as a setting of its own: every other null is left out of
# Trainer(...), so that Lightning's default stands
NULL_IS_A_SETTING = ("check_val_every_n_epoch",)


@contextmanager
def found_by_every_worker() -> Iterator[None]:
    """A bad value or bad data found inside is found by every worker under torchrun: only the first says it."""
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
    """Run one configured training job in `run_dir`; returns the final metrics (also in metrics.json), or
    None in a torchrun / srun worker other than global rank 0.

    `callbacks`: the caller's, added after psgd's own (pickled into every worker process). A `run_dir` that
    holds an earlier run's metrics.json is refused (DirInUse) before anything is written into it, unless
    the job is one of a `continued` sweep, which resumes from its own last checkpoint.
    """
    refuse_a_run_while_a_worker_imports_the_script()
    with found_by_every_worker():  # the config and the machine decide it
        plan = check(cfg)
    in_use = None if continued else earlier_results(Path(run_dir), run_dir_key())
    if in_use:
        raise DirInUse(in_use)
    with run_settings(bool(cfg.get("quiet"))):
        return _train(cfg, Path(run_dir), plan, list(callbacks), continued)


def micro_batches_per_update(plan: Plan, num_nodes: int, synchronous: bool) -> int:
    """The batches one optimizer update averages: DDP's averages every worker's (on every node); a
    model-averaging or HogWild worker updates with its own alone. Each accumulates its share."""
    return (plan.workers * num_nodes if synchronous else 1) * plan.accumulate_grad_batches


def _check_picklable(callbacks: list[L.Callback], net: torch.nn.Module) -> None:
    """The caller's callbacks go to every worker process pickled: one that cannot is refused here, naming
    it, as is a callback or model class defined in a notebook's session (defined_in_session)."""
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
    """Build the run from the checked config, fit it, test its final weights and write its results."""
    if plan.launcher == "torchrun":
        torchrun.stop_with_agent()  # an agent killed outright (OOM, kill -9) must not leave its workers training
        torchrun.mark_running_under_torchrun()  # so that a worker that dies without a word can be named
    L.seed_everything(cfg.seed, workers=True, verbose=False)  # before the model: same seed, same init
    world_size = plan.workers * cfg.trainer.num_nodes  # the workers of all nodes
    net, image_size = build_model(cfg.model, cfg.data.name)
    datamodule = build_datamodule(cfg, image_size)
    read_data(cfg, plan, datamodule, net, image_size)
    module = build_module(cfg, plan, net, image_size)
    with found_by_every_worker():
        # the weights of an earlier run to start from (a resume, ckpt_path, restores its own over them)
        started_from = init_weights(cfg.get("init_weights"), module)
        ckpt_path = resolve_ckpt_path(
            elastic_resume(cfg.get("ckpt_path"), plan, run_dir, continued),
            module,
            world_size,
            cfg.strategy.name,
            max_time=cfg.trainer.get("max_time"),
            max_steps=cfg.trainer.get("max_steps"),
        )
    strategy = build_strategy(cfg, plan, run_dir)
    if plan.launcher == "psgd" and not isinstance(strategy, str):  # psgd starts worker processes
        _check_picklable(extra_callbacks, net)
    info = run_info(cfg, plan, strategy, module, started_from, ckpt_path)
    callbacks = build_callbacks(cfg, plan, module, run_dir, info) + extra_callbacks
    trainer = build_trainer(cfg, plan, strategy, callbacks, run_dir)
    info["precision"] = str(trainer.precision)  # as Lightning runs it (RunRecorder holds `info`)
    fit(cfg, plan, trainer, module, datamodule, ckpt_path, run_dir)
    return finish_run(cfg, plan, trainer, module, datamodule, run_dir, callbacks[1])


def read_data(cfg: DictConfig, plan: Plan, datamodule: ClassificationData, net: nn.Module, image_size: int) -> None:
    """Read the dataset and judge what needs it, before any worker starts: a missing dataset, a worker
    without a batch, a final test of no batch and a run that cannot fit in memory fail here."""
    world_size = plan.workers * cfg.trainer.num_nodes
    with found_by_every_worker():
        datamodule.prepare_data()
        if short := check_data(cfg, datamodule, world_size):
            warn(short)  # a shard smaller than one batch
        if plan.accelerator == "cpu" and plan.launcher == "psgd":  # every worker on this machine
            sizes, _ = datamodule.train_shards(world_size)
            check_memory(cfg, net, image_size, sizes, plan.workers)


def build_module(cfg: DictConfig, plan: Plan, net: nn.Module, image_size: int) -> Classifier:
    """The LightningModule: `net`, the optimizer, the lr scaled to the workers and the lr schedule."""
    t = cfg.trainer
    samples_per_update = cfg.data.batch_size * micro_batches_per_update(plan, t.num_nodes, cfg.strategy.name == "ddp")
    info = INFO[cfg.data.name]
    return Classifier(
        net,
        # plain lists, not ListConfig: a checkpoint holding one does not load with weights_only=True
        instantiate(cfg.optimizer, _convert_="all"),
        lr=scaled_lr(
            cfg.optimizer.lr,
            plan.workers * t.num_nodes,
            cfg.lr_scaling,
            samples_per_update=samples_per_update,
            reference_batch=cfg.get("lr_reference_batch"),
        ),
        workers=plan.workers,
        max_epochs=t.max_epochs,
        scheduler=schedule(OmegaConf.to_container(cfg.scheduler, resolve=True)),  # scheduler=none: a constant lr
        num_classes=info.num_classes,
        channels_last=cfg.channels_last,
        per_worker_metrics=cfg.strategy.name not in ("ddp", "hogwild"),  # replicas differ: each evaluated
        input_shape=(info.channels, image_size, image_size),
        # kept in its checkpoints: a resume on other samples is refused (psgd.resume)
        dataset=cfg.data.name,
        holdout=[cfg.data.val_split, cfg.seed] if cfg.data.val_split else None,
        shards=shard_settings(cfg),
        num_nodes=t.num_nodes,
        optimizer_lr=cfg.optimizer.lr,
        lr_by_workers=scales_by_workers(cfg),
        compile=compile_mode(cfg.get("compile")),
    )


def run_info(
    cfg: DictConfig, plan: Plan, strategy: Any, module: Classifier, started_from: str | None, ckpt_path: str | None
) -> dict[str, Any]:
    """What metrics.json says of the run's setup."""
    t = cfg.trainer
    if isinstance(strategy, str):
        lightning_strategy = strategy
    elif type(strategy) is ReportsFirstFailure:  # Lightning's DDP, reporting the worker that failed first
        lightning_strategy = "DDPStrategy"
    else:
        lightning_strategy = type(strategy).__name__
    world_size = plan.workers * t.num_nodes
    return {
        "strategy": cfg.strategy.name,
        "workers": plan.workers,
        "world_size": world_size,
        "num_nodes": t.num_nodes,
        "threads_per_worker": plan.threads_per_worker,
        "launcher": plan.launcher,
        # how psgd started the worker processes (null: it started none, one worker or torchrun / srun)
        "start_method": plan.start_method if plan.launcher == "psgd" and world_size > 1 else None,
        "lightning_strategy": lightning_strategy,
        "model": cfg.model.name,
        "data": cfg.data.name,
        "partition": cfg.data.partition,
        "batch_size": cfg.data.batch_size,
        "precision": None,  # as Lightning runs it (16-mixed on CPU runs as bf16-mixed): set once it is known
        "accumulate_grad_batches": plan.accumulate_grad_batches,
        "parallel_batches": micro_batches_per_update(plan, t.num_nodes, cfg.strategy.name == "ddp"),
        "optimizer": cfg.optimizer._target_.rsplit(".", 1)[-1],
        "lr": module.hparams["lr"],
        "lr_scaling": cfg.lr_scaling,
        "lr_reference_batch": cfg.get("lr_reference_batch"),
        "init_weights": started_from,
        "resumed_from": ckpt_path,
        "seed": cfg.seed,
        "device": device_description(plan.accelerator),
        "versions": versions(),
    }


def progress_bars(cfg: DictConfig) -> bool:
    """Progress bars on a terminal; into a file or pipe (SLURM, CI, `> log`) a line per epoch instead."""
    return not cfg.get("quiet") and sys.stdout.isatty()


def build_callbacks(
    cfg: DictConfig, plan: Plan, module: Classifier, run_dir: Path, info: dict[str, Any]
) -> list[L.Callback]:
    """psgd's callbacks for the training Trainer; the RunRecorder second."""
    es = cfg.early_stop
    bars = progress_bars(cfg)
    per_step_lr = schedule_read(module.hparams["scheduler"]).get("interval") == "step"
    callbacks: list[L.Callback] = [
        WorkerSetup(plan.threads_per_worker, cfg.seed, cfg.flush_denormal, step_logs=per_step_lr),
        RunRecorder(str(run_dir), info, es.target_acc, echo=not cfg.get("quiet") and not bars),
        LatestCheckpoint(run_dir / "checkpoints"),  # the first checkpoint callback: trainer.checkpoint_callback
    ]
    if cfg.checkpoint_every_epoch:
        callbacks.append(EpochCheckpoints(run_dir / "checkpoints"))
    if es.target_acc is not None:
        callbacks.append(TargetAccuracyStop(es.target_acc, es.patience))
    if per_step_lr:  # the lr every trainer.log_every_n_steps steps (tag lr_step; `lr` is each epoch's start)
        callbacks.append(LearningRateMonitor(logging_interval="step"))
    if cfg.record_shards:
        callbacks.append(ShardRecorder(str(run_dir)))
    if cfg.get("record_weights"):
        callbacks.append(WeightRecorder(str(run_dir)))
    if bars:
        callbacks.append(TQDMProgressBar(refresh_rate=10))  # redrawing every step costs throughput
    return callbacks


def trainer_settings(cfg: DictConfig, plan: Plan) -> dict[str, Any]:
    """The Trainer's arguments from trainer.* and the plan, with checkpoints written atomically."""
    settings = {
        k: v
        for k, v in OmegaConf.to_container(cfg.trainer, resolve=True).items()
        if v is not None or k in NULL_IS_A_SETTING
    }
    settings.update(
        accelerator=plan.accelerator, devices=plan.workers, accumulate_grad_batches=plan.accumulate_grad_batches
    )
    if settings.get("profiler") == "pytorch":  # Lightning's own cannot be pickled into worker processes
        settings["profiler"] = PyTorchProfilerForWorkers()
    plugins = settings.pop("plugins", [])
    settings["plugins"] = [*(plugins if isinstance(plugins, list) else [plugins]), AtomicCheckpointIO()]
    return settings


def build_trainer(cfg: DictConfig, plan: Plan, strategy: Any, callbacks: list[L.Callback], run_dir: Path) -> L.Trainer:
    """The training Trainer; a trainer.* value Lightning refuses is a ConfigError."""
    try:
        return L.Trainer(
            **trainer_settings(cfg, plan),
            strategy=strategy,
            callbacks=callbacks,
            logger=TensorBoardLogger(str(run_dir), name="tensorboard", version="", default_hp_metric=False),
            use_distributed_sampler=False,  # the datamodule shards; Lightning must not shard a second time
            enable_progress_bar=progress_bars(cfg),
            enable_model_summary=not cfg.get("quiet"),
        )
    except (TypeError, ValueError, MisconfigurationException) as e:
        raise ConfigError(f"Lightning refuses a trainer setting: {' '.join(text_lines(e))}") from e


def fit(
    cfg: DictConfig,
    plan: Plan,
    trainer: L.Trainer,
    module: Classifier,
    datamodule: ClassificationData,
    ckpt_path: str | None,
    run_dir: Path,
) -> None:
    """trainer.fit, with SIGTERM stopping it as Ctrl-C does. A run that stops is marked in metrics.json
    (its finished epochs kept) and exits as psgd.stopped says."""
    launcher = plan.launcher == "psgd"
    try:
        if plan.launcher == "torchrun":  # where Lightning would make it, inside fit: same failure handling
            init_elastic_process_group(
                plan.accelerator, cfg.strategy.backend, timedelta(seconds=cfg.strategy.timeout_s)
            )
        with (
            rendezvous_port() if launcher else nullcontext(),
            signals.launching() if launcher else nullcontext(),
            signals.sigterm_interrupts(),
        ):
            trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
    except BaseException as e:
        if plan.launcher == "torchrun":
            signals.ignore_sigterm()  # the agent's SIGTERM after a failure: this one says why first
            gone = torchrun_worker_gone(e, run_dir)
            if gone is not None:  # not an interrupt, not this worker's own failure: psgd.cli reports it
                raise gone from e
        if launcher or trainer.global_rank == 0:  # torchrun / srun: each worker gets here, one says so
            mark_stopped(run_dir, e, launched=launcher)
        exit_if_interrupted(e)
        refused = lightning_refusal(e)
        if refused:
            raise ConfigError(f"Lightning refuses a setting: {refused}") from e
        raise


def finish_run(
    cfg: DictConfig,
    plan: Plan,
    trainer: L.Trainer,
    module: Classifier,
    datamodule: ClassificationData,
    run_dir: Path,
    recorder: RunRecorder,
) -> dict[str, Any] | None:
    """Test the final weights in this process, on one device, and write the results (under torchrun / srun:
    global rank 0; the others return None). Ctrl-C or SIGTERM here marks the run interrupted."""
    try:
        if plan.launcher != "psgd":  # torchrun / srun: every worker is a process like this one
            rank = trainer.global_rank
            if dist.is_initialized():  # the test below must not sync metrics with the other workers
                dist.barrier()
                dist.destroy_process_group()
            if rank != 0:
                return None
        tested = final_test(cfg, plan, trainer.precision, module, datamodule)
        return write_results(cfg, run_dir, module, tested, recorder)
    except (KeyboardInterrupt, SystemExit) as e:
        if plan.launcher == "psgd" or trainer.global_rank == 0:  # torchrun / srun: one writer, one line
            mark_stopped(run_dir, e)
        exit_if_interrupted(e)  # (always raises here)
        raise


def final_test(
    cfg: DictConfig, plan: Plan, precision: Any, module: Classifier, datamodule: ClassificationData
) -> dict[str, float]:
    """The test split's metrics for `module`, in this process: the workers have exited or are this process."""
    t = cfg.trainer
    limits = {"limit_test_batches": t.limit_test_batches} if t.get("limit_test_batches") is not None else {}
    with _quiet_lightning_banner():
        tester = L.Trainer(
            accelerator=plan.accelerator,
            devices=1,
            logger=False,
            callbacks=[WorkerSetup(cpu_count(), flush_denormal=cfg.flush_denormal)],
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=False,
            fast_dev_run=t.fast_dev_run,
            precision=precision,  # as fit ran
            **limits,
        )
    with signals.sigterm_interrupts():
        (tested,) = tester.test(module, datamodule=datamodule, verbose=False)
    return tested


def write_results(
    cfg: DictConfig, run_dir: Path, module: Classifier, tested: dict[str, float], recorder: RunRecorder
) -> dict[str, Any]:
    """metrics.json completed with the test's results, and the TensorBoard summary; returns the metrics."""
    record_path = run_dir / "metrics.json"
    metrics = read_json(record_path) if record_path.exists() else recorder.summary("trained")
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
    return metrics
