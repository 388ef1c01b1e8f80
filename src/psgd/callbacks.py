"""Lightning callbacks: worker setup, the progress bar, whole-epoch checkpoints, epoch timing and result files
(with what synchronising the workers cost), the target-accuracy stop."""

import contextlib
import time
import warnings
from pathlib import Path
from typing import Any

import pytorch_lightning as L
import torch
import torch.distributed as dist
from pytorch_lightning.callbacks import Callback, ModelCheckpoint, Timer, TQDMProgressBar
from pytorch_lightning.plugins import TorchCheckpointIO
from typing_extensions import override

from psgd.data.partition import worker_seed
from psgd.io import save_atomic, write_csv, write_json
from psgd.process import this_process
from psgd.signals import handler_for_this_process
from psgd.stragglers import Stragglers
from psgd.strategies.lightning_internals import as_finished_epoch, handle_sigterm_with
from psgd.strategies.records import FIGURES, Reports, comm_summary, epoch_workers, sync_summary, workers_summary
from psgd.strategies.workers import over_workers


def denormals_flushed() -> bool:
    """Whether this process's CPU flushes denormal floats to zero (torch has a setter, no getter)."""
    return torch.tensor([1e-40]).item() == 0.0


class WorkerSetup(Callback):
    """Set up each worker process: torch's threads, denormal flushing, psgd's SIGTERM handler, and its
    random stream, reseeded every epoch from (seed, rank, epoch) so that a resumed run goes on exactly.

    flush_denormal: momentum buffers of units that get no gradient decay into denormal floats, on which
    every CPU multiply is slow; flushed to zero, the step time stays flat. Restored at teardown.
    step_logs: whether anything is logged per step; without, Lightning's warning that an epoch has
    fewer batches than log_every_n_steps is filtered (psgd logs every epoch whatever the interval).
    """

    def __init__(self, threads: int, seed: int | None = None, flush_denormal: bool = True, step_logs: bool = True):
        self.threads, self.seed, self.flush_denormal, self.step_logs = threads, seed, flush_denormal, step_logs
        self._flushed_before: bool | None = None

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        torch.set_num_threads(self.threads)
        handle_sigterm_with(trainer, handler_for_this_process())
        self._flushed_before = denormals_flushed()
        torch.set_flush_denormal(self.flush_denormal)
        if not self.step_logs:
            warnings.filterwarnings(
                "ignore", message=r"The number of training batches \(\d+\) is smaller than the logging"
            )
        # overfit_batches: psgd's loaders are no DataLoaders, and keep epoch 0's batches themselves
        warnings.filterwarnings("ignore", message=r"You requested to overfit but enabled \w+ dataloader shuffling")

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._flushed_before is not None:
            torch.set_flush_denormal(self._flushed_before)
            self._flushed_before = None

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.seed is not None:
            torch.manual_seed(worker_seed(self.seed, trainer.global_rank, trainer.current_epoch))


class EpochBar(TQDMProgressBar):
    """Lightning's progress bar (a terminal's), its epochs counted from 1, as psgd's lines and metrics.json do."""

    @override
    def init_train_tqdm(self) -> Any:
        bar, trainer = super().init_train_tqdm(), self.trainer
        lightnings = bar.set_description

        def from_one(desc: str | None = None, refresh: bool = True) -> None:
            if desc == f"Epoch {trainer.current_epoch}":  # Lightning's, counted from 0
                desc = f"Epoch {trainer.current_epoch + 1}/{trainer.max_epochs}"
            lightnings(desc, refresh)

        bar.set_description = from_one
        return bar


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoints written through a temp file beside them and renamed, so that a run killed while
    writing leaves the previous checkpoint whole (Lightning's temp file in /tmp may be on another file
    system, where its move is a copy over the checkpoint)."""

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        save_atomic(checkpoint, path)


class EpochEndCheckpoint(ModelCheckpoint):
    """checkpoints/last.ckpt, rewritten after every whole training epoch, so that a run that dies resumes from
    its last finished epoch; with `keep_all` (checkpoint_every_epoch=true) also every epoch's epoch<N>.ckpt.

    Only whole epochs are written: a run cut inside an epoch (trainer.max_steps, max_time, an early stop)
    resumes from its last whole epoch and trains the cut epoch again from its start, exactly as the
    uninterrupted run did (WorkerSetup reseeds every epoch)."""

    def __init__(self, dirpath: str | Path, keep_all: bool = False) -> None:
        # (Lightning's save_last writes last.ckpt only after a top-k save: with save_top_k=0, at the end alone)
        files = dict(filename="epoch{epoch}", save_top_k=-1, save_last=True) if keep_all else dict(filename="last")
        super().__init__(
            dirpath=dirpath,
            **files,
            auto_insert_metric_name=False,
            enable_version_counter=False,
            save_on_train_epoch_end=True,
        )

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
            super().on_train_epoch_end(trainer, pl_module)
        else:  # nor is it written again at the train's end (a strategy's final checkpoint)
            self.best_model_path = self.last_model_path = ""

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Nothing (Lightning's save_last writes last.ckpt at the end of a fit that wrote none, inside an epoch)."""

    @override
    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        """Write an epoch's checkpoint as one of a finished epoch, from which a resume starts the next one
        (Lightning writes it before it counts the epoch completed: lightning_internals.as_finished_epoch)."""
        as_finished_epoch(checkpoint)

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """A resume into another run dir starts this dir's checkpoints afresh (Lightning would warn that the
        old dir's top-k bookkeeping is not restored: there is none)."""
        if state_dict.get("dirpath", self.dirpath) == self.dirpath:
            super().load_state_dict(state_dict)


class ShardRecorder(Callback):
    """Saves the sample indices each worker trained on: shards/epoch<e>_rank<r>.pt (record_shards=true)."""

    def __init__(self, out_dir: str):
        self.out_dir = Path(out_dir) / "shards"

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        loader = trainer.train_dataloader  # (simulated workers: every one's, psgd.data.ReplicaLoader)
        by_worker = getattr(loader, "seen_by_worker", None) or [getattr(loader, "seen", [])]
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for rank, seen in enumerate(by_worker, start=trainer.global_rank):
            indices = torch.cat(seen) if seen else torch.empty(0, dtype=torch.long)
            save_atomic(indices, self.out_dir / f"epoch{trainer.current_epoch}_rank{rank}.pt")


class WeightRecorder(Callback):
    """Every worker saves the weights it ends with: weights/rank<r>.pt (record_weights=true)."""

    def __init__(self, out_dir: str):
        self.out_dir = Path(out_dir) / "weights"

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        strategy = trainer.strategy  # (simulated workers: every one of them, held in this process)
        ranks = strategy.comm.ranks if isinstance(strategy, Reports) else [trainer.global_rank]
        replica = getattr(strategy, "replica", lambda rank: contextlib.nullcontext())
        for rank in ranks:
            with replica(rank):
                state = {k: v.detach().cpu().clone() for k, v in pl_module.state_dict().items()}
            save_atomic(state, self.out_dir / f"rank{rank}.pt")


def reached(accuracy: float | None, target: float | None) -> bool:
    """A validation at the target (none without a validation or a target)."""
    return accuracy is not None and target is not None and accuracy >= target


class TargetAccuracyStop(Callback):
    """Stop once val/acc >= `target_acc` for `patience` consecutive epochs (None: never); val/acc is reduced
    over the workers, so every worker takes the same decision."""

    def __init__(self, target_acc: float | None, patience: int = 1):
        self.target_acc, self.patience = target_acc, patience
        self.streak = 0
        self.stopped_epoch: int | None = None

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        self.streak = self.streak + 1 if reached(_get(trainer.callback_metrics, "val/acc"), self.target_acc) else 0
        if self.streak >= self.patience:
            trainer.should_stop = True
            self.stopped_epoch = trainer.current_epoch

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Resumed from the checkpoint of a run this rule had stopped: that run is over (its weights are tested)."""
        if self.stopped_epoch is not None:
            trainer.should_stop = True

    @override
    def state_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in ("streak", "stopped_epoch", "target_acc", "patience")}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Another target or patience is a new rule: its count starts afresh."""
        if (state_dict.get("target_acc"), state_dict.get("patience")) == (self.target_acc, self.patience):
            self.streak, self.stopped_epoch = state_dict["streak"], state_dict["stopped_epoch"]


def stop_reason(trainer: L.Trainer) -> str:
    """What ended a fit: `fast_dev_run`, `early_stop`, `max_epochs`, `max_steps` or `max_time`."""
    if trainer.fast_dev_run:
        return "fast_dev_run"
    if any(isinstance(c, TargetAccuracyStop) and c.stopped_epoch is not None for c in trainer.callbacks):
        return "early_stop"
    epochs_done = trainer.max_epochs not in (None, -1) and trainer.current_epoch >= trainer.max_epochs
    if epochs_done and trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
        return "max_epochs"
    if trainer.max_steps not in (None, -1) and trainer.global_step >= trainer.max_steps:
        return "max_steps"
    timer = next((c for c in trainer.callbacks if isinstance(c, Timer)), None)
    remaining = timer.time_remaining() if timer is not None else None
    if remaining is not None and remaining <= 0:
        return "max_time"
    return "max_epochs"


class RunRecorder(Callback):
    """Times each epoch's training (validation excluded), logs time/* metrics, and has rank 0 rewrite
    metrics.json and training_data.csv after every epoch.

    time/epoch_s is the slowest worker's training time; time/samples_per_s sums every worker's own
    throughput; time/cumulative_s adds up epoch_s.
    """

    def __init__(
        self, out_dir: str, run_info: dict[str, Any], target_acc: float | None = None, echo: bool = False
    ) -> None:
        self.out_dir = Path(out_dir)
        self.run_info, self.target_acc = run_info, target_acc
        self.echo = echo  # rank 0 prints a line per epoch (for a log file)
        self.history: list[dict[str, Any]] = []
        self.strategy_report: dict[str, Any] = {}
        self.stopped_by: str | None = None  # what ended training (stop_reason), once it has ended
        self.max_epochs: int | None = None
        self._trained = False
        self.cumulative_s = 0.0
        self.time_to_target_s: float | None = None
        self.epoch_to_target: int | None = None  # the epoch (from 1) whose validation first reached it
        self.step_to_target: int | None = None
        self.sim_time_to_target_s: float | None = None  # simulated workers: their simulated time to the target
        self._t0 = self._val_t0 = 0.0
        self._step0 = 0  # the optimizer steps before this epoch
        self._val_s = 0.0
        self._samples = 0
        self._lr: float | None = None  # the lr the epoch started with
        self._validated = False  # a validation ran in this epoch

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.max_epochs = trainer.max_epochs if trainer.max_epochs not in (None, -1) else None

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._trained = True

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._val_s, self._samples, self._validated, self._step0 = 0.0, 0, False, trainer.global_step
        self._lr = float(trainer.optimizers[0].param_groups[0]["lr"]) if trainer.optimizers else None
        self._t0 = time.perf_counter()

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        self._samples += len(batch[1])

    @override
    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._val_t0 = time.perf_counter()

    @override
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self._val_s += time.perf_counter() - self._val_t0

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The first validation at the target sets time_to_target_s: the slowest worker's training time up
        to it. val/acc is reduced over the workers, so every worker joins the all-reduce."""
        if trainer.state.fn != "fit" or trainer.sanity_checking:
            return
        self._validated = True
        if self.target_acc is None:
            return
        val_acc = _get(trainer.callback_metrics, "val/acc")
        if self.time_to_target_s is None and reached(val_acc, self.target_acc):
            trained_s = time.perf_counter() - self._t0 - self._val_s
            (trained_s,) = over_workers([trained_s], pl_module.device, dist.ReduceOp.MAX)
            self.time_to_target_s, self.epoch_to_target = self.cumulative_s + trained_s, trainer.current_epoch + 1
            self.step_to_target = trainer.global_step
            simulated_time = getattr(trainer.strategy, "simulated_time", None)
            if simulated_time is not None:
                self.sim_time_to_target_s = simulated_time()

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        train_s = max(time.perf_counter() - self._t0 - self._val_s, 1e-9)
        if hasattr(pl_module, "finish_train_epoch"):
            pl_module.finish_train_epoch()
        (epoch_s,) = over_workers([train_s], pl_module.device, dist.ReduceOp.MAX)
        rate, samples = over_workers([self._samples / train_s, self._samples], pl_module.device)
        self.cumulative_s += epoch_s
        for name, value in (
            ("time/epoch_s", epoch_s),
            ("time/samples_per_s", rate),
            ("time/cumulative_s", self.cumulative_s),
        ):
            # equal on every worker; sync_dist keeps Lightning's bookkeeping the same across ranks
            pl_module.log(name, value, on_step=False, on_epoch=True, sync_dist=True)
        stragglers = next((c for c in trainer.callbacks if isinstance(c, Stragglers)), None)
        slept = stragglers.take_wait() if stragglers is not None else None
        comm = epoch_workers(trainer.strategy, pl_module.device, trainer.global_step - self._step0, slept)
        if slept is not None:  # the mean over the workers
            waits = comm["straggler_wait_s"]
            pl_module.log("stragglers/wait_s", sum(waits) / len(waits), on_step=False, on_epoch=True, sync_dist=True)
        for name, key in (("comm/bytes", "comm_bytes"), ("comm/s", "comm_s")):
            if None not in comm[key]:  # per worker, the mean over the workers
                pl_module.log(name, sum(comm[key]) / len(comm[key]), on_step=False, on_epoch=True, sync_dist=True)
        # a psgd strategy's figures of this epoch, reduced over the workers (each worker calls it here)
        figures = trainer.strategy.epoch_figures() if isinstance(trainer.strategy, Reports) else {}
        for name, value in figures.items():
            pl_module.log(FIGURES[name][0], value, on_step=False, on_epoch=True, sync_dist=True)

        metrics = trainer.callback_metrics
        # (callback_metrics keeps the last validation's figures through epochs without one)
        val_loss, val_acc = (_get(metrics, "val/loss"), _get(metrics, "val/acc")) if self._validated else (None, None)
        record = {
            "epoch": trainer.current_epoch + 1,
            "step": trainer.global_step,
            "time": round(self.cumulative_s, 4),
            "epoch_s": round(epoch_s, 4),
            "samples": int(samples),
            "samples_per_s": round(rate, 1),
            "lr": None if self._lr is None else float(f"{self._lr:.6g}"),
            "train_loss": _get(metrics, "train/loss"),
            "train_acc": _get(metrics, "train/acc"),
            "val_loss": val_loss,
            "val_acc": val_acc,
            **{name: round(value, FIGURES[name][1]) for name, value in figures.items()},
            **comm,
        }
        self.history.append(record)
        if trainer.is_global_zero:
            self._write("running")
            if self.echo:
                print(epoch_line(self.history[-1], trainer.max_epochs), flush=True)

    @override
    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        # Ctrl-C or a crash: keep the finished epochs, marked as such (a launcher's parent has no history)
        if trainer.is_global_zero and self._trained:
            self._write("interrupted" if isinstance(exception, KeyboardInterrupt) else "failed")

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # after Strategy.on_train_end: the strategy's final report is included
        self.strategy_report = dict(trainer.strategy.report) if isinstance(trainer.strategy, Reports) else {}
        self.stopped_by = stop_reason(trainer)
        if trainer.is_global_zero:
            self._write("trained")

    def summary(self, status: str) -> dict[str, Any]:
        samples = sum(h["samples"] for h in self.history)
        return {
            **self.run_info,
            "status": status,
            "process": this_process(),  # tells a live job from a killed one
            "epochs": len(self.history),
            "max_epochs": self.max_epochs,
            "stopped_by": self.stopped_by,
            "train_time_s": round(self.cumulative_s, 4),
            "samples_per_s": round(samples / self.cumulative_s, 1) if self.cumulative_s > 0 else None,
            "val_acc": self.last_val_acc(),
            "target_acc": self.target_acc,
            "time_to_target_s": None if self.time_to_target_s is None else round(self.time_to_target_s, 4),
            "epoch_to_target": self.epoch_to_target,
            "step_to_target": self.step_to_target,
            **self._simulated_summary(),
            **self._averaging_summary(),
            **sync_summary(self.history),
            **comm_summary(self.history, self.strategy_report.get("comm_at_end")),
            **workers_summary(self.history),
            "history": self.history,
        }

    def _simulated_summary(self) -> dict[str, Any]:
        """Simulated workers: the run's simulated time and its time to the target (s); {} for worker processes."""
        if not self.run_info.get("simulate"):
            return {}
        last = self.history[-1].get("sim_time_s") if self.history else None
        to_target = self.sim_time_to_target_s
        return {"sim_time_s": last, "sim_time_to_target_s": None if to_target is None else round(to_target, 6)}

    def last_val_acc(self) -> float | None:
        """The last validation's accuracy."""
        return next((h["val_acc"] for h in reversed(self.history) if h["val_acc"] is not None), None)

    def _averaging_summary(self) -> dict[str, Any]:
        report = {k: v for k, v in self.strategy_report.items() if k != "comm_at_end"}
        if "averaged_val_acc" not in report:
            return report
        # the final val figures are the averaged model's; the last epoch's are the replicas' mean
        report["val_acc_before_averaging"] = self.last_val_acc()
        report["val_acc"] = report.pop("averaged_val_acc")
        report["val_loss"] = report.pop("averaged_val_loss")
        return report

    def _write(self, status: str) -> None:
        write_json(self.out_dir / "metrics.json", self.summary(status))
        rows = [[h["time"], h["val_acc"]] for h in self.history if h["val_acc"] is not None]
        write_csv(self.out_dir / "training_data.csv", ["time", "val_accuracy"], rows)

    # what a checkpoint keeps: the finished epochs and the time to the target
    _kept = ("history", "cumulative_s", "time_to_target_s", "epoch_to_target", "step_to_target", "sim_time_to_target_s")

    @override
    def state_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._kept} | {"target_acc": self.target_acc}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for name in self._kept:
            setattr(self, name, state_dict.get(name))
        if state_dict.get("target_acc") != self.target_acc:  # another target: the first recorded epoch at it
            hit = next((h for h in self.history if reached(h["val_acc"], self.target_acc)), None)
            self.time_to_target_s, self.epoch_to_target, self.step_to_target = (
                (hit["time"], hit["epoch"], hit["step"]) if hit else (None, None, None)
            )


def epoch_line(record: dict[str, Any], max_epochs: int | None) -> str:
    """`psgd: epoch 2/8 train_loss=0.3120 ... val_acc=0.9712 epoch_s=4.2 samples_per_s=12188.0`."""
    of = f"/{max_epochs}" if max_epochs and max_epochs > 0 else ""
    parts = [f"psgd: epoch {record['epoch']}{of}"]
    for key in ("train_loss", "train_acc", "val_loss", "val_acc"):
        if record.get(key) is not None:
            parts.append(f"{key}={record[key]:.4f}")
    parts += [f"epoch_s={record['epoch_s']:.1f}", f"samples_per_s={record['samples_per_s']:.1f}"]
    if record.get("sim_time_s") is not None:
        parts.append(f"sim_time_s={record['sim_time_s']:.2f}")
    return " ".join(parts)


def _get(metrics: dict, key: str) -> float | None:
    return round(float(metrics[key]), 6) if key in metrics else None
