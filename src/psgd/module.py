"""The LightningModule for image classification: loss, torchmetrics accuracy, optimizer and schedule."""

import itertools
import math
from collections.abc import Callable
from typing import Any

import pytorch_lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.optim.lr_scheduler import LRScheduler
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy
from typing_extensions import override

from psgd.errors import TrainingDiverged
from psgd.optim import build_scheduler, schedule_read
from psgd.strategies.workers import gather_floats

# the optimizer's class name, kept in its checkpoints: a resume with another optimizer= is refused
OPTIMIZER_KEY = "psgd_optimizer"
# param-group entries that say how torch runs the update, not what it computes: a resumed run takes its own
STEP_IMPLEMENTATION = ("foreach", "fused", "differentiable", "capturable")


def _loss_mean() -> MeanMetric:
    """A mean loss that keeps a NaN batch's NaN (torchmetrics' default drops it: a diverging model's
    val_loss would be the mean of its finite batches)."""
    return MeanMetric(nan_strategy=float("nan"))


class Classifier(L.LightningModule):
    """Cross-entropy classification of a plain nn.Module. Metrics are reduced over the workers once per
    epoch, so no step holds a collective but the strategy's own."""

    def __init__(
        self,
        net: nn.Module,
        optimizer: Callable[..., torch.optim.Optimizer],
        lr: float,
        workers: int = 1,  # per node
        max_epochs: int = 1,
        scheduler: dict | None = None,
        num_classes: int = 10,
        channels_last: bool = False,
        per_worker_metrics: bool = False,
        input_shape: tuple[int, int, int] | None = None,
        samples: list[str] | None = None,  # resume.sample_settings: a resume on other samples is refused
        num_nodes: int = 1,  # kept in checkpoints: a resume under a warm-up from 1/workers compares all workers
        compile: str | None = None,  # torch.compile's mode for the network ("default", "reduce-overhead", ...)
    ):
        super().__init__()
        self.save_hyperparameters(ignore=["net", "optimizer", "input_shape"])
        self.net = net.to(memory_format=torch.channels_last) if channels_last else net
        if input_shape is not None:  # Lightning's model summary shows each layer's sizes
            self.example_input_array = torch.zeros(1, *input_shape)
        self.optimizer_factory = optimizer
        self.scheduler_cfg = scheduler  # a plain dict: checkpoints stay loadable with weights_only=True
        for stage in ("val", "test"):
            setattr(self, f"{stage}_acc", MulticlassAccuracy(num_classes, average="micro", validate_args=False))
            setattr(self, f"{stage}_loss", _loss_mean())
        # each class's test accuracy (its recall): which labels the final model knows
        self.test_class_acc = MulticlassAccuracy(num_classes, average=None, validate_args=False)
        self.test_acc_per_class: list[float | None] | None = None
        # the replica the module is now, of those this process holds: simulated workers' (one in a worker process)
        self.replica, self.replicas = 0, 1
        # each replica's training [correct, loss sum, samples], reduced once per epoch (count_train)
        self._train_counts: Tensor | None = None
        self._val_counts: Tensor | None = None  # per_worker_metrics: each replica's validation's, likewise
        self._net_compiled = False  # the network compiled in place, once (on_fit_start)
        # count_train logs the batches since the last log (simulated workers: after the last worker's batch only)
        self.log_step_counts = True
        self._step_counts: list | None = None

    @override
    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def _step(self, batch: tuple[Tensor, Tensor], batch_idx: int, stage: str) -> tuple[Tensor, Tensor]:
        """Loss and metrics of one batch; returns the loss and the model's output."""
        x, y = batch
        out = self(x)
        loss = F.cross_entropy(out, y)  # also right for log-softmax outputs: log_softmax is idempotent
        acc, mean_loss = getattr(self, f"{stage}_acc"), getattr(self, f"{stage}_loss")
        acc.update(out.detach(), y)
        mean_loss.update(loss.detach(), weight=len(y))
        if batch_idx == 0:  # Lightning computes, reduces and resets a logged Metric at the epoch's end
            self.log(f"{stage}/acc", acc, on_step=False, on_epoch=True, prog_bar=stage == "val")
            self.log(f"{stage}/loss", mean_loss, on_step=False, on_epoch=True)
        return loss, out

    @override
    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        out = self(x)
        loss = F.cross_entropy(out, y)
        self.count_train(out.detach(), y, loss.detach(), batch_idx)
        return loss

    def count_train(self, out: Tensor, y: Tensor, loss: Tensor, batch_idx: int) -> None:
        """Add a training batch to the replica's [correct, loss sum, samples] of the epoch, on the device (no
        sync per step); every trainer.log_every_n_steps batches, log the batches' mean since the last log
        as train/loss_step and train/acc_step (rank 0)."""
        if self._train_counts is None or (batch_idx == 0 and self.replica == 0):
            self._train_counts = self._zero_counts(out.device)
            self._step_counts = [torch.zeros(2, dtype=torch.float64, device=out.device), 0]
        sums = self._count_into(self._train_counts, out, y, loss)
        self._step_counts[0] = self._step_counts[0] + sums
        self._step_counts[1] += len(y)
        if self.log_step_counts and (batch_idx + 1) % max(1, self.trainer.log_every_n_steps) == 0:
            self._log_step_counts(self.trainer.global_step)

    def _log_step_counts(self, step: int) -> None:
        """Log the batches counted since the last log as train/loss_step and train/acc_step at `step` (rank 0)."""
        (sums, n), self._step_counts = self._step_counts, [torch.zeros_like(self._step_counts[0]), 0]
        if n and self.trainer.is_global_zero and self.loggers:
            correct, loss_sum = sums.tolist()
            for logger in self.loggers:
                logger.log_metrics({"train/loss_step": loss_sum / n, "train/acc_step": correct / n}, step=step)

    @override
    def on_train_epoch_end(self) -> None:
        self.finish_train_epoch()

    def finish_train_epoch(self) -> None:
        """Log the epoch's training accuracy and mean loss over every worker's samples, and with several workers
        each one's own loss (worker/<rank>/train_loss), from one all-gather (every worker gets here once per
        epoch, also with uneven shards); a no-op once logged."""
        if self._train_counts is None:
            return
        self._log_step_counts(self.trainer.global_step - 1)  # at the epoch's last step
        per_worker = self._per_worker(self._train_counts)
        self._train_counts = None
        correct, loss_sum, n = (math.fsum(column) for column in zip(*per_worker))
        if not math.isfinite(loss_sum):
            # every worker has the same sum, so all stop together: NaN weights never recover
            raise TrainingDiverged(
                f"training diverged: the mean training loss of epoch {self.current_epoch + 1} is "
                f"{loss_sum / max(n, 1)}; lower optimizer.lr (the run's lr is {self.hparams.lr:g}) or warm up "
                "(scheduler=warmup)"
            )
        # the same value on every worker; sync_dist keeps Lightning's epoch bookkeeping the same across ranks
        self.log("train/acc", correct / max(n, 1), on_step=False, on_epoch=True, sync_dist=True)
        self.log("train/loss", loss_sum / max(n, 1), on_step=False, on_epoch=True, sync_dist=True, prog_bar=True)
        if len(per_worker) > 1:  # each worker's own batches: replicas that drift apart show here
            for rank, (_, worker_loss, worker_n) in enumerate(per_worker):
                self.log(f"worker/{rank}/train_loss", worker_loss / max(worker_n, 1), on_epoch=True, sync_dist=True)

    def _zero_counts(self, device: torch.device) -> Tensor:
        """[correct, loss sum, samples] of each replica held here, zero (float64)."""
        return torch.zeros(self.replicas, 3, dtype=torch.float64, device=device)

    def _count_into(self, counts: Tensor, out: Tensor, y: Tensor, loss: Tensor) -> Tensor:
        """Add a batch to the replica's row of `counts`; returns its [correct, loss sum]."""
        sums = torch.stack([(out.argmax(1) == y).sum().double(), loss.double() * len(y)])
        counts[self.replica, :2] += sums
        counts[self.replica, 2] += len(y)
        return sums

    def _per_worker(self, counts: Tensor) -> list[list[float]]:
        """Every worker's row of `counts` (a row per replica held here), in rank order, from one all-gather."""
        rows = gather_floats(counts.flatten().tolist(), counts.device)
        return [row[i : i + 3] for row in rows for i in range(0, len(row), 3)]

    @override
    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        loss, out = self._step(batch, batch_idx, "val")
        if self.hparams.per_worker_metrics:  # the same output, kept unreduced for this replica
            if self._val_counts is None:
                self._val_counts = self._zero_counts(out.device)
            self._count_into(self._val_counts, out.detach(), batch[1], loss.detach())

    @override
    def on_validation_epoch_start(self) -> None:
        # every validation counts afresh in each worker's own tensors: the metrics' states pickled into the
        # workers share memory (Lightning makes only parameters and buffers private), so each worker's
        # counts added up into every worker's, and the sanity check's batches are not the first validation's
        for name in ("val_acc", "val_loss"):
            getattr(self, name).reset()
        self._val_counts = None

    @override
    def on_validation_epoch_end(self) -> None:
        if not self.hparams.per_worker_metrics or self.trainer.sanity_checking:
            return
        counts = self._val_counts if self._val_counts is not None else self._zero_counts(self.device)  # no batch
        for rank, (correct, loss_sum, n) in enumerate(self._per_worker(counts)):  # the same on every worker
            # NaN for a worker that validated no sample: no figure, not a perfect loss
            self.log(f"worker/{rank}/val_acc", correct / n if n else math.nan, on_epoch=True, sync_dist=True)
            self.log(f"worker/{rank}/val_loss", loss_sum / n if n else math.nan, on_epoch=True, sync_dist=True)

    @torch.no_grad()
    def evaluate(self, loader, max_batches: int | None = None) -> tuple[float, float]:
        """Accuracy and mean loss of this process's model over `loader`'s first `max_batches` batches (None:
        all), with no logging or communication, in the precision plugin's input cast and forward context."""
        was_training = self.training
        self.eval()
        plugin = self.trainer.precision_plugin
        correct, loss_sum, n = 0, 0.0, 0
        for x, y in itertools.islice(loader, max_batches):
            x, y = plugin.convert_input(x.to(self.device)), y.to(self.device)
            with plugin.forward_context():
                out = self(x).float()
            loss_sum += F.cross_entropy(out, y, reduction="sum").item()
            correct += (out.argmax(1) == y).sum().item()
            n += len(y)
        self.train(was_training)
        return correct / max(n, 1), loss_sum / max(n, 1)

    @override
    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        _, out = self._step(batch, batch_idx, "test")
        self.test_class_acc.update(out.detach(), batch[1])

    @override
    def on_test_epoch_end(self) -> None:
        metric = self.test_class_acc
        tested = (metric.tp + metric.fn).tolist()  # each class's test samples
        self.test_acc_per_class = [
            round(acc, 6) if n else None for acc, n in zip(metric.compute().tolist(), tested, strict=True)
        ]
        metric.reset()

    @override
    def on_fit_start(self) -> None:
        # compiled in place (state_dict keys unchanged) in the worker that trains it, after Lightning's
        # model summary ran its example input
        mode = self.hparams.get("compile")
        if mode and not self._net_compiled:
            self.net.compile(mode=mode)
            self._net_compiled = True

    @override
    def on_train_start(self) -> None:
        """scheduler.restart with ckpt_path: the checkpoint's weights and optimizer state (restored by now) go on
        under a new schedule from this epoch to max_epochs, from this run's lr."""
        if not ((self.scheduler_cfg or {}).get("restart") and self.trainer.ckpt_path):
            return
        optimizer = self.trainer.optimizers[0]
        for group, fresh in zip(optimizer.param_groups, self.build_optimizer().param_groups, strict=True):
            group["lr"] = group["initial_lr"] = fresh["lr"]
        scheduler = self.build_schedule(optimizer, self.hparams.max_epochs - self.trainer.current_epoch)
        for config in self.trainer.lr_scheduler_configs:  # (none under a constant lr)
            config.scheduler = scheduler

    @override
    def on_train_epoch_start(self) -> None:
        # at the epoch's first step, from which this lr is used (self.log would place it at the epoch's last)
        lr = self.trainer.optimizers[0].param_groups[0]["lr"]
        for logger in self.loggers:  # rank 0 writes (Lightning's loggers log on rank 0 only)
            logger.log_metrics({"lr": lr}, step=self.trainer.global_step)

    def build_optimizer(self) -> torch.optim.Optimizer:
        """The run's optimizer over the network's parameters (its own param groups, if it has them)."""
        groups = self.net.param_groups() if hasattr(self.net, "param_groups") else self.net.parameters()
        return self.optimizer_factory(groups, lr=self.hparams.lr)

    def build_schedule(self, optimizer: torch.optim.Optimizer, epochs: int) -> LRScheduler | None:
        """The run's lr schedule over `epochs` epochs, stepped per epoch or per optimizer step (interval)."""
        cfg = schedule_read(self.scheduler_cfg)
        interval, steps_per_epoch = cfg.pop("interval", "epoch"), 1
        if interval == "step":  # this worker's optimizer steps per epoch, as Lightning will run them
            self.trainer.estimated_stepping_batches  # noqa: B018 -- sets up the training data if not yet done
            steps_per_epoch = max(
                1, math.ceil(self.trainer.num_training_batches / self.trainer.accumulate_grad_batches)
            )
        world = self.hparams.workers * self.trainer.num_nodes  # a warm-up from 1/world, as lr_scaling scales
        return build_scheduler(optimizer, world, epochs, steps_per_epoch=steps_per_epoch, **cfg)

    @override
    def configure_optimizers(self):
        optimizer = self.build_optimizer()
        scheduler = self.build_schedule(optimizer, self.hparams.max_epochs)
        interval = schedule_read(self.scheduler_cfg).get("interval", "epoch")
        if scheduler is None:
            return optimizer
        # with interval=step, run.py's LearningRateMonitor logs it as lr_step
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": interval, "name": "lr_step"},
        }

    @override
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.trainer.optimizers:
            checkpoint[OPTIMIZER_KEY] = type(self.trainer.optimizers[0]).__name__

    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Give the checkpoint's param groups this run's STEP_IMPLEMENTATION settings (e.g. optimizer.fused)
        before the optimizer loads them, so that torch places the state as this run's update needs it."""
        fresh = self.build_optimizer().param_groups  # no state: only its settings are read
        for state in checkpoint.get("optimizer_states") or []:
            for saved, group in zip(state.get("param_groups") or [], fresh):
                saved.update({k: group[k] for k in STEP_IMPLEMENTATION if k in group})
