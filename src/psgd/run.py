"""One training run: check the config, build data, module and Trainer, fit, test, write the results.

What a run dir holds (metrics.json, training_data.csv, tensorboard/, checkpoints/) is docs/outputs.md's.
"""

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytorch_lightning as L
import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.callbacks import LearningRateMonitor
from pytorch_lightning.loggers import TensorBoardLogger
from pytorch_lightning.utilities.exceptions import MisconfigurationException
from torch import nn

from psgd import signals, torchrun
from psgd.callbacks import (
    AtomicCheckpointIO,
    EpochBar,
    EpochEndCheckpoint,
    RunRecorder,
    ShardRecorder,
    TargetAccuracyStop,
    WeightRecorder,
    WorkerSetup,
)
from psgd.choices import COMPRESSION_KEYS, INFO
from psgd.config import ConfigError, DirInUse, Plan, build_model, check, compile_mode, schedule
from psgd.console import first_worker, text_lines
from psgd.data import ClassificationData
from psgd.data.datasets import DataError
from psgd.environment import cpu_count, device_description, versions
from psgd.io import read_json, write_json
from psgd.module import Classifier
from psgd.optim import scaled_lr, schedule_read
from psgd.outputs import earlier_results
from psgd.process import run_settings
from psgd.rendezvous import init_elastic_process_group, rendezvous_port
from psgd.resume import elastic_resume, init_weights, resolve_ckpt_path, sample_settings
from psgd.run_checks import build_datamodule
from psgd.stopped import exit_if_interrupted, lightning_refusal, mark_stopped, torchrun_worker_gone
from psgd.stragglers import Stragglers, describe, simulated
from psgd.strategies import ElasticAveragingStrategy, HogwildStrategy, ModelAveragingStrategy
from psgd.strategies.ddp import ReportsFirstFailure
from psgd.summary import write_tensorboard_summary


def build_strategy(cfg: DictConfig, plan: Plan, run_dir: Path) -> Any:
    """Lightning's strategy for strategy.*: psgd's model averaging or HogWild, DDP, or "auto" for one process."""
    s = cfg.strategy
    common = {
        "process_group_backend": s.backend,  # None: gloo on CPU, nccl on GPU
        # torchrun / srun started every worker: Lightning's popen launcher starts none
        "start_method": plan.start_method if plan.launcher == "psgd" else "popen",
        "timeout": timedelta(seconds=s.timeout_s),
    }
    if s.name in ("model_averaging", "elastic_averaging"):  # a replica per worker
        common |= {
            "same_init": s.same_init,
            "average_buffers": s.average_buffers,
            "seed": cfg.seed,
            "replica_dir": str(run_dir / "replicas") if s.save_replicas else None,
        }
    if s.name == "elastic_averaging":
        return ElasticAveragingStrategy(tau=s.tau, alpha=s.alpha, **common)
    if s.name == "model_averaging":
        return ModelAveragingStrategy(
            period=s.period,
            average_optimizer_state=s.average_optimizer_state,
            sync_steps=s.sync_steps,
            group_periods=OmegaConf.to_container(s.group_periods) if s.get("group_periods") else None,
            outer_optimizer=instantiate(s.outer_optimizer, _convert_="all") if s.get("outer_optimizer") else None,
            **common,
        )
    if s.name == "hogwild":
        common.pop("start_method")  # always forkserver: see SharedMemoryLauncher
        return HogwildStrategy(lock=s.lock, shared_queue=s.shared_queue, **common)
    if plan.workers == 1 and cfg.trainer.num_nodes == 1 and not s.get("ddp_for_one_worker", False):
        return "auto"  # one process: no process group, nothing to all-reduce
    ddp_kwargs: dict[str, Any] = {"bucket_cap_mb": s.bucket_cap_mb} if s.get("bucket_cap_mb") is not None else {}
    options = {key: s[key] for key in COMPRESSION_KEYS if s.get(key) is not None}  # null: the method's default
    return ReportsFirstFailure(  # Lightning's DDPStrategy; a failed run names the worker that failed first
        **common,
        find_unused_parameters=s.find_unused_parameters,
        gradient_as_bucket_view=True,
        compression=s.get("compression", "none"),
        compression_options={**options, "seed": cfg.seed},
        **ddp_kwargs,
    )


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


def train(cfg: DictConfig, run_dir: str | Path, callbacks: Sequence[L.Callback] = ()) -> dict[str, Any] | None:
    """Run one configured training job in `run_dir`: build data, module and Trainer, fit, test the final
    weights and write the results; returns the final metrics (also in metrics.json), or None in a torchrun /
    srun worker other than global rank 0. `callbacks` run after psgd's own. A `run_dir` holding an earlier
    run's metrics.json is refused (DirInUse)."""
    with found_by_every_worker():  # the config and the machine decide it
        plan = check(cfg)
    run_dir = Path(run_dir)
    if in_use := earlier_results(run_dir, run_dir_key()):
        raise DirInUse(in_use)
    with run_settings(bool(cfg.get("quiet"))):
        if plan.launcher == "torchrun":
            torchrun.stop_with_agent()  # an agent killed outright (OOM, kill -9) must not leave its workers training
            torchrun.mark_running_under_torchrun()  # so that a worker that dies without a word can be named
        L.seed_everything(cfg.seed, workers=True, verbose=False)  # before the model: same seed, same init
        world_size = plan.workers * cfg.trainer.num_nodes  # the workers of all nodes
        net, image_size = build_model(cfg.model, cfg.data.name)
        datamodule = build_datamodule(cfg, image_size)
        module = build_module(cfg, plan, net, image_size)
        with found_by_every_worker():
            datamodule.prepare_data()  # the data is read before any worker starts: a missing dataset fails here
            datamodule.check_batches(world_size)  # a worker without a batch fails here
            datamodule.check_test_limit(cfg.trainer.get("limit_test_batches"))
            # the weights of an earlier run to start from (a resume, ckpt_path, restores its own over them)
            started_from = init_weights(cfg.get("init_weights"), module)
            ckpt_path = resolve_ckpt_path(
                elastic_resume(cfg.get("ckpt_path"), plan, run_dir), module, world_size, cfg.strategy.name
            )
        if started_from and first_worker() and not cfg.get("quiet"):
            print(f"psgd: starting from the weights in {started_from} (init_weights)", flush=True)
        if simulated(cfg.stragglers) and first_worker() and not cfg.get("quiet"):
            print(f"psgd: simulating stragglers: {describe(cfg.stragglers)} (stragglers.*)", flush=True)
        strategy = build_strategy(cfg, plan, run_dir)
        info = run_info(cfg, plan, strategy, module, started_from, ckpt_path)
        all_callbacks = build_callbacks(cfg, plan, module, run_dir, info) + list(callbacks)
        trainer = build_trainer(cfg, plan, strategy, all_callbacks, run_dir)
        info["precision"] = str(trainer.precision)  # as Lightning runs it (RunRecorder holds `info`)
        fit(cfg, plan, trainer, module, datamodule, ckpt_path, run_dir)
        return finish_run(cfg, plan, trainer, module, datamodule, run_dir)


def micro_batches_per_update(cfg: DictConfig, plan: Plan) -> int:
    """The micro-batches one optimizer update averages: every worker's under DDP, a worker's own otherwise."""
    synchronous = cfg.strategy.name == "ddp"
    return (plan.workers * cfg.trainer.num_nodes if synchronous else 1) * plan.accumulate_grad_batches


def build_module(cfg: DictConfig, plan: Plan, net: nn.Module, image_size: int) -> Classifier:
    """The LightningModule: `net`, the optimizer, the lr scaled to the workers and the lr schedule."""
    t = cfg.trainer
    samples_per_update = cfg.data.batch_size * micro_batches_per_update(cfg, plan)
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
        samples=sample_settings(cfg),
        num_nodes=t.num_nodes,
        compile=compile_mode(cfg.get("compile")),
    )


def run_info(
    cfg: DictConfig, plan: Plan, strategy: Any, module: Classifier, started_from: str | None, ckpt_path: str | None
) -> dict[str, Any]:
    """What metrics.json says of how the run ran (docs/outputs.md); its settings are in .hydra/config.yaml."""
    world_size = plan.workers * cfg.trainer.num_nodes
    if isinstance(strategy, str):
        lightning_strategy = strategy
    else:  # ReportsFirstFailure is Lightning's DDPStrategy, naming the worker that failed first
        lightning_strategy = "DDPStrategy" if type(strategy) is ReportsFirstFailure else type(strategy).__name__
    return {
        "strategy": cfg.strategy.name,
        "workers": plan.workers,
        "world_size": world_size,
        "num_nodes": cfg.trainer.num_nodes,
        "threads_per_worker": plan.threads_per_worker,
        "launcher": plan.launcher,
        # how psgd started the worker processes (null: it started none, one worker or torchrun / srun)
        "start_method": plan.start_method if plan.launcher == "psgd" and world_size > 1 else None,
        "lightning_strategy": lightning_strategy,
        "partition": cfg.data.partition,
        "compression": cfg.strategy.get("compression") if cfg.strategy.name == "ddp" else None,
        "stragglers": OmegaConf.to_container(cfg.stragglers) if simulated(cfg.stragglers) else None,
        "precision": None,  # as Lightning runs it (16-mixed on CPU runs as bf16-mixed): set once it is known
        "parallel_batches": micro_batches_per_update(cfg, plan),
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
    per_step_lr = schedule_read(module.hparams["scheduler"]).get("interval") == "step"
    callbacks: list[L.Callback] = [
        WorkerSetup(plan.threads_per_worker, cfg.seed, cfg.flush_denormal, step_logs=per_step_lr),
        RunRecorder(str(run_dir), info, es.target_acc, echo=not cfg.get("quiet") and not progress_bars(cfg)),
        EpochEndCheckpoint(run_dir / "checkpoints", keep_all=cfg.checkpoint_every_epoch),
        TargetAccuracyStop(es.target_acc, es.patience),  # also without a target: its checkpoint state is there
    ]
    if per_step_lr:  # the lr every trainer.log_every_n_steps steps (tag lr_step; `lr` is each epoch's start)
        callbacks.append(LearningRateMonitor(logging_interval="step"))
    if simulated(cfg.stragglers):
        callbacks.append(Stragglers(**OmegaConf.to_container(cfg.stragglers), seed=cfg.seed))
    if cfg.record_shards:
        callbacks.append(ShardRecorder(str(run_dir)))
    if cfg.get("record_weights"):
        callbacks.append(WeightRecorder(str(run_dir)))
    if progress_bars(cfg):
        callbacks.append(EpochBar())
    return callbacks


def build_trainer(cfg: DictConfig, plan: Plan, strategy: Any, callbacks: list[L.Callback], run_dir: Path) -> L.Trainer:
    """The training Trainer from trainer.* and the plan, with checkpoints written atomically; a trainer.* value
    Lightning refuses is a ConfigError. A null is left out, so that Lightning's default stands, but for
    check_val_every_n_epoch's, a setting of Lightning's own."""
    settings = {
        k: v
        for k, v in OmegaConf.to_container(cfg.trainer, resolve=True).items()
        if v is not None or k == "check_val_every_n_epoch"
    }
    plugins = settings.pop("plugins", [])
    settings.update(
        accelerator=plan.accelerator,
        devices=plan.workers,
        accumulate_grad_batches=plan.accumulate_grad_batches,
        plugins=[*(plugins if isinstance(plugins, list) else [plugins]), AtomicCheckpointIO()],
    )
    try:
        return L.Trainer(
            **settings,
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
    """trainer.fit, SIGTERM stopping it as Ctrl-C does; a run that stops is marked as psgd.stopped says."""
    launcher = plan.launcher == "psgd"
    try:
        if plan.launcher == "torchrun":  # where Lightning would make it, inside fit: same failure handling
            init_elastic_process_group(
                plan.accelerator, cfg.strategy.backend, timedelta(seconds=cfg.strategy.timeout_s)
            )
        with (
            rendezvous_port() if launcher else nullcontext(),
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
) -> dict[str, Any] | None:
    """Test the final weights on one device in this process (global rank 0's under torchrun / srun; the others
    return None), complete metrics.json with the test's results and write the TensorBoard summary; returns the
    metrics. Ctrl-C or SIGTERM here marks the run interrupted."""
    try:
        if plan.launcher != "psgd":  # torchrun / srun: every worker is a process like this one
            rank = trainer.global_rank
            if dist.is_initialized():  # the test below must not sync metrics with the other workers
                dist.barrier()
                dist.destroy_process_group()
            if rank != 0:
                return None
        tested = final_test(cfg, plan, trainer.precision, module, datamodule)
        record_path = run_dir / "metrics.json"  # rank 0's RunRecorder wrote it at the fit's end
        metrics = read_json(record_path)
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
    except (KeyboardInterrupt, SystemExit) as e:
        if plan.launcher == "psgd" or trainer.global_rank == 0:  # torchrun / srun: one writer, one line
            mark_stopped(run_dir, e)
        exit_if_interrupted(e)  # (always raises here)
        raise


def final_test(
    cfg: DictConfig, plan: Plan, precision: Any, module: Classifier, datamodule: ClassificationData
) -> dict[str, float]:
    """The test split's metrics for `module`, in this process: the workers have exited or are this process."""
    tester = L.Trainer(
        accelerator=plan.accelerator,
        devices=1,
        logger=False,
        callbacks=[WorkerSetup(cpu_count(), flush_denormal=cfg.flush_denormal)],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        fast_dev_run=cfg.trainer.fast_dev_run,
        limit_test_batches=cfg.trainer.get("limit_test_batches"),  # None: Lightning's default, every batch
        precision=precision,  # as fit ran
    )
    with signals.sigterm_interrupts():
        (tested,) = tester.test(module, datamodule=datamodule, verbose=False)
    return tested
