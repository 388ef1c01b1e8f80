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
from omegaconf import DictConfig
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
from psgd.choices import INFO
from psgd.config import ConfigError, DirInUse, Plan, Run, build_model, check, compile_mode
from psgd.console import first_worker, text_lines
from psgd.data import ClassificationData
from psgd.environment import cpu_count, device_description, versions
from psgd.errors import DataError
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
from psgd.strategies.ddp import ReportsFirstFailure
from psgd.strategies.network import Network
from psgd.strategies.simulated import check_simulation
from psgd.strategies.simulated import simulated as simulated_workers
from psgd.summary import write_tensorboard_summary


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
    srun worker other than global rank 0. `cfg` is Hydra's composed config, checked and read as the typed
    run (psgd.config.Run). `callbacks` run after psgd's own. A `run_dir` holding an earlier run's metrics.json
    is refused (DirInUse)."""
    with found_by_every_worker():  # the config and the machine decide it
        plan = check(cfg)
    run, run_dir = plan.run, Path(run_dir)
    if in_use := earlier_results(run_dir, run_dir_key()):
        raise DirInUse(in_use)
    with run_settings(run.quiet):
        if plan.launcher == "torchrun":
            torchrun.stop_with_agent()  # an agent killed outright (OOM, kill -9) must not leave its workers training
            torchrun.mark_running_under_torchrun()  # so that a worker that dies without a word can be named
        L.seed_everything(run.seed, workers=True, verbose=False)  # before the model: same seed, same init
        net, image_size = build_model(run.model.settings(), run.data.name)
        if run.simulate:  # before any replica is made
            need = check_simulation(
                net, run.model.name, run.world_size, run.optimizer.settings(), run.strategy.replica_copies(),
                plan.accelerator,
            )  # fmt: skip
            if first_worker() and not run.quiet:
                n = run.network
                print(
                    f"psgd: simulating {run.world_size} workers in this process (about {need / 2**30:.1f} GiB) on a "
                    f"{n.bandwidth_gbps:g} Gb/s, {n.latency_ms:g} ms network, compute x{n.compute_scale:g} (network.*)",
                    flush=True,
                )
        datamodule = build_datamodule(run, image_size)
        module = build_module(run, plan, net, image_size)
        with found_by_every_worker():
            datamodule.prepare_data()  # the data is read before any worker starts: a missing dataset fails here
            datamodule.check_batches(run.world_size)  # a worker without a batch fails here
            datamodule.check_test_limit(run.trainer.limit_test_batches)
            # the weights of an earlier run to start from (a resume, ckpt_path, restores its own over them)
            started_from = init_weights(run.init_weights, module)
            ckpt_path = resolve_ckpt_path(
                elastic_resume(run.ckpt_path, plan, run_dir), module, run.world_size, run.strategy, run.simulate
            )
        if started_from and first_worker() and not run.quiet:
            print(f"psgd: starting from the weights in {started_from} (init_weights)", flush=True)
        stragglers = run.stragglers.model_dump()
        if simulated(stragglers) and first_worker() and not run.quiet:
            on = " on the simulated clocks" if run.simulate else ""
            print(f"psgd: simulating stragglers{on}: {describe(stragglers)} (stragglers.*)", flush=True)
        strategy = run.strategy.build(run, plan, run_dir)
        if run.simulate:
            network = Network(**run.network.model_dump())
            one_model = run.strategy.one_model
            strategy = simulated_workers(strategy, run.world_size, network, one_model, stragglers, run.seed)
        info = run_info(run, plan, strategy, module, started_from, ckpt_path)
        all_callbacks = build_callbacks(run, plan, module, run_dir, info) + list(callbacks)
        trainer = build_trainer(run, plan, strategy, all_callbacks, run_dir)
        info["precision"] = str(trainer.precision)  # as Lightning runs it (RunRecorder holds `info`)
        fit(run, plan, trainer, module, datamodule, ckpt_path, run_dir, info)
        return finish_run(run, plan, trainer, module, datamodule, run_dir)


def micro_batches_per_update(run: Run, plan: Plan) -> int:
    """The micro-batches one optimizer update averages: every worker's where they keep in step (DDP), a worker's
    own otherwise."""
    return (run.world_size if run.strategy.lockstep else 1) * plan.accumulate_grad_batches


def build_module(run: Run, plan: Plan, net: nn.Module, image_size: int) -> Classifier:
    """The LightningModule: `net`, the optimizer, the lr scaled to the workers and the lr schedule."""
    samples_per_update = run.data.batch_size * micro_batches_per_update(run, plan)
    info = INFO[run.data.name]
    return Classifier(
        net,
        # plain lists, not ListConfig: a checkpoint holding one does not load with weights_only=True
        instantiate(run.optimizer.settings(), _convert_="all"),
        lr=scaled_lr(
            run.optimizer.lr,
            run.world_size,
            run.lr_scaling,
            samples_per_update=samples_per_update,
            reference_batch=run.lr_reference_batch,
        ),
        workers=run.workers_per_node,
        max_epochs=run.trainer.max_epochs,
        scheduler=run.scheduler.trained(),  # scheduler=none: a constant lr
        num_classes=info.num_classes,
        channels_last=run.channels_last,
        # replicas differ: each evaluated (simulated workers: in one process, their pooled figures)
        per_worker_metrics=not run.strategy.one_model,
        input_shape=(info.channels, image_size, image_size),
        samples=sample_settings(run),
        num_nodes=run.trainer.num_nodes,
        compile=compile_mode(run.compile),
    )


def run_info(
    run: Run, plan: Plan, strategy: Any, module: Classifier, started_from: str | None, ckpt_path: str | None
) -> dict[str, Any]:
    """What metrics.json says of how the run ran (docs/outputs.md); its settings are in .hydra/config.yaml."""
    cls = type(strategy).__mro__[1] if run.simulate else type(strategy)  # simulated: SimulatedWorkers in front
    if isinstance(strategy, str):
        lightning_strategy = strategy
    else:  # ReportsFirstFailure is Lightning's DDPStrategy, naming the worker that failed first
        lightning_strategy = "DDPStrategy" if cls is ReportsFirstFailure else cls.__name__
    return {
        "strategy": run.strategy.name,
        "workers": run.workers_per_node,
        "world_size": run.world_size,
        "num_nodes": run.trainer.num_nodes,
        "threads_per_worker": plan.threads_per_worker,
        "launcher": plan.launcher,
        # how psgd started the worker processes (null: it started none, one worker or torchrun / srun)
        "start_method": (
            plan.start_method if plan.launcher == "psgd" and run.world_size > 1 and not run.simulate else None
        ),
        "simulate": run.simulate,
        "network": run.network.model_dump() if run.simulate else None,
        "lightning_strategy": lightning_strategy,
        "partition": run.data.partition,
        **run.strategy.record(),
        "stragglers": stragglers if simulated(stragglers := run.stragglers.model_dump()) else None,
        "precision": None,  # as Lightning runs it (16-mixed on CPU runs as bf16-mixed): set once it is known
        "parallel_batches": micro_batches_per_update(run, plan),
        "lr": module.hparams["lr"],
        "lr_scaling": run.lr_scaling,
        "lr_reference_batch": run.lr_reference_batch,
        "init_weights": started_from,
        "resumed_from": ckpt_path,
        "seed": run.seed,
        "device": device_description(plan.accelerator),
        "versions": versions(),
    }


def progress_bars(run: Run) -> bool:
    """Progress bars on a terminal; into a file or pipe (SLURM, CI, `> log`) a line per epoch instead."""
    return not run.quiet and sys.stdout.isatty()


def build_callbacks(run: Run, plan: Plan, module: Classifier, run_dir: Path, info: dict[str, Any]) -> list[L.Callback]:
    """psgd's callbacks for the training Trainer; the RunRecorder second."""
    es = run.early_stop
    per_step_lr = schedule_read(module.hparams["scheduler"]).get("interval") == "step"
    callbacks: list[L.Callback] = [
        WorkerSetup(plan.threads_per_worker, run.seed, run.flush_denormal, step_logs=per_step_lr),
        RunRecorder(str(run_dir), info, es.target_acc, echo=not run.quiet and not progress_bars(run)),
        EpochEndCheckpoint(run_dir / "checkpoints", keep_all=run.checkpoint_every_epoch),
        TargetAccuracyStop(es.target_acc, es.patience),  # also without a target: its checkpoint state is there
    ]
    if per_step_lr:  # the lr every trainer.log_every_n_steps steps (tag lr_step; `lr` is each epoch's start)
        callbacks.append(LearningRateMonitor(logging_interval="step"))
    if simulated(stragglers := run.stragglers.model_dump()) and not run.simulate:  # (simulated: on their clocks)
        callbacks.append(Stragglers(**stragglers, seed=run.seed))
    if run.record_shards:
        callbacks.append(ShardRecorder(str(run_dir)))
    if run.record_weights:
        callbacks.append(WeightRecorder(str(run_dir)))
    if progress_bars(run):
        callbacks.append(EpochBar())
    return callbacks


def build_trainer(run: Run, plan: Plan, strategy: Any, callbacks: list[L.Callback], run_dir: Path) -> L.Trainer:
    """The training Trainer from trainer.* and the plan, with checkpoints written atomically; a trainer.* value
    Lightning refuses is a ConfigError. A null is left out, so that Lightning's default stands, but for
    check_val_every_n_epoch's, a setting of Lightning's own."""
    settings = {k: v for k, v in run.trainer.model_dump().items() if v is not None or k == "check_val_every_n_epoch"}
    plugins = settings.pop("plugins", [])
    settings.update(
        accelerator=plan.accelerator,
        devices=1 if run.simulate else run.workers_per_node,  # simulated workers: one process, one device
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
            enable_progress_bar=progress_bars(run),
            enable_model_summary=not run.quiet,
        )
    except (TypeError, ValueError, MisconfigurationException) as e:
        raise ConfigError(f"Lightning refuses a trainer setting: {' '.join(text_lines(e))}") from e


def fit(
    run: Run,
    plan: Plan,
    trainer: L.Trainer,
    module: Classifier,
    datamodule: ClassificationData,
    ckpt_path: str | None,
    run_dir: Path,
    info: dict[str, Any],
) -> None:
    """trainer.fit, SIGTERM stopping it as Ctrl-C does; a run that stops is marked as psgd.stopped says (a record
    made from `info`, run_info's, where no worker had written one)."""
    launcher = plan.launcher == "psgd"
    try:
        if plan.launcher == "torchrun":  # where Lightning would make it, inside fit: same failure handling
            init_elastic_process_group(
                plan.accelerator, run.strategy.backend, timedelta(seconds=run.strategy.timeout_s)
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
            mark_stopped(run_dir, e, launched=launcher, info=info)
        exit_if_interrupted(e)
        refused = lightning_refusal(e)
        if refused:
            raise ConfigError(f"Lightning refuses a setting: {refused}") from e
        raise


def finish_run(
    run: Run,
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
        tested = final_test(run, plan, trainer.precision, module, datamodule)
        record_path = run_dir / "metrics.json"  # rank 0's RunRecorder wrote it at the fit's end
        metrics = read_json(record_path)
        metrics.update(
            status="completed",
            test_acc=round(tested["test/acc"], 6),
            test_loss=round(tested["test/loss"], 6),
            test_acc_per_class=module.test_acc_per_class,
            test_classes=list(INFO[run.data.name].classes),
        )
        write_json(record_path, metrics)
        steps = metrics["history"][-1]["step"] if metrics["history"] else 0
        write_tensorboard_summary(run_dir / "tensorboard", run, metrics, steps)
        return metrics
    except (KeyboardInterrupt, SystemExit) as e:
        if plan.launcher == "psgd" or trainer.global_rank == 0:  # torchrun / srun: one writer, one line
            mark_stopped(run_dir, e)
        exit_if_interrupted(e)  # (always raises here)
        raise


def final_test(
    run: Run, plan: Plan, precision: Any, module: Classifier, datamodule: ClassificationData
) -> dict[str, float]:
    """The test split's metrics for `module`, in this process: the workers have exited or are this process."""
    tester = L.Trainer(
        accelerator=plan.accelerator,
        devices=1,
        logger=False,
        callbacks=[WorkerSetup(cpu_count(), flush_denormal=run.flush_denormal)],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        fast_dev_run=run.trainer.fast_dev_run,
        limit_test_batches=run.trainer.limit_test_batches,  # None: Lightning's default, every batch
        precision=precision,  # as fit ran
    )
    with signals.sigterm_interrupts():
        (tested,) = tester.test(module, datamodule=datamodule, verbose=False)
    return tested
