"""The LightningModule for image classification: loss, torchmetrics accuracy, optimizer and schedule."""

import itertools
import math
from collections.abc import Callable
from typing import Any

import pytorch_lightning as L
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy
from typing_extensions import override

from psgd.advice import hogwild_workers, step_advice
from psgd.config import ConfigError
from psgd.optim import build_scheduler, schedule_read

# a per-step schedule's optimizer steps per epoch (this worker's), kept in its checkpoints
STEPS_PER_EPOCH_KEY = "psgd_steps_per_epoch"


def cut_short(batch_progress: dict[str, Any]) -> bool:
    """Whether the training epoch (Lightning's batch progress, as its state_dict) ended before its last batch."""
    return not batch_progress.get("is_last_batch", True) and batch_progress["current"]["completed"] > 0


def fit_loop_state(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """Lightning's fit-loop state in a checkpoint (its progress counts and, under "state_dict", the training
    loader's place); {} where it holds none. Its layout is Lightning's, public but not documented."""
    return (checkpoint.get("loops") or {}).get("fit_loop") or {}


def keep_a_cut_epoch_unfinished(checkpoint: dict[str, Any]) -> bool:
    """Mark a checkpoint written after an epoch that ended before its last batch (trainer.max_steps,
    max_time, an early stop after a validation inside the epoch) as written inside that epoch.

    Lightning counts such an epoch as trained: a resume would skip the epoch's remaining batches (with
    max_epochs) or train its first batches again (with a larger max_steps). Marked unfinished, Lightning
    resumes inside the epoch, and the training loader goes on from its place there
    (TensorLoader.state_dict), so the resumed run trains what the uninterrupted one would have.
    Returns whether it was such a checkpoint."""
    fit = fit_loop_state(checkpoint)
    batches, epochs = fit.get("epoch_loop.batch_progress"), fit.get("epoch_progress")
    if not batches or not epochs or not cut_short(batches):
        return False
    if epochs["current"]["processed"] != epochs["current"]["started"]:
        return False  # written inside the epoch already (a checkpoint at a batch's end)
    for count in (epochs["current"], epochs["total"]):
        count["processed"] = count["completed"] = count["started"] - 1
    checkpoint["epoch"] = epochs["current"]["completed"]  # (Lightning's current_epoch: the cut epoch's index)
    return True


# the optimizer's class name, kept in its checkpoints: a resume with another optimizer= is refused
OPTIMIZER_KEY = "psgd_optimizer"
# in a checkpoint written where an epoch was cut short: that epoch's training counts so far, all workers'
CUT_EPOCH_COUNTS_KEY = "psgd_cut_epoch_train_counts"
# param-group entries that say how torch runs the update, not what it computes: a resumed run takes its own
STEP_IMPLEMENTATION = ("foreach", "fused", "differentiable", "capturable")


class TrainingDiverged(RuntimeError):
    """The training loss became NaN or infinite; str() is the one-line message shown to the user."""


def _loss_mean(**kwargs) -> MeanMetric:
    """A mean validation or test loss that keeps a NaN batch's NaN (torchmetrics' default drops NaN values
    with a warning, which would make a diverging model's val_loss the mean of its finite batches). A float
    nan_strategy puts that float (NaN) in their place, in every torchmetrics pyproject allows; "disable"
    is refused by torchmetrics 1.4, and 1.9 then ignores `weight`."""
    return MeanMetric(nan_strategy=float("nan"), **kwargs)


class Classifier(L.LightningModule):
    """Wraps a plain nn.Module. Metrics are accumulated per step and reduced once per epoch (over
    all workers), so no step pays for a collective other than the strategy's own."""

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
        dataset: str | None = None,
        holdout: list | None = None,
        shards: list | None = None,
        num_nodes: int = 1,  # kept in checkpoints: a resume under a warm-up from 1/workers compares all workers
        optimizer_lr: float | None = None,  # the optimizer.lr lr_scaling made `lr` (the one to lower on divergence)
        lr_by_workers: bool = False,  # lr_scaling scaled it by the workers (lr_reference_batch=null)
        compile: str | None = None,  # torch.compile's mode for the network ("default", "reduce-overhead", ...)
    ):
        super().__init__()
        self.save_hyperparameters(ignore=["net", "optimizer", "input_shape"])
        self.net = net.to(memory_format=torch.channels_last) if channels_last else net
        # compiled in place (state_dict keys unchanged) in each worker at the start of fit: see compile_net
        self._compile_mode = compile
        if input_shape is not None:
            # one (channels, height, width) image: Lightning's model summary at the start of fit runs it
            # through the network and shows each layer's input and output sizes and its forward FLOPs
            self.example_input_array = torch.zeros(1, *input_shape)
        self.optimizer_factory = optimizer
        self.scheduler_cfg = scheduler  # a plain dict: checkpoints stay loadable with weights_only=True
        for stage in ("val", "test"):
            setattr(self, f"{stage}_acc", MulticlassAccuracy(num_classes, average="micro", validate_args=False))
            setattr(self, f"{stage}_loss", _loss_mean())
        # each class's test accuracy (its recall): which labels the final model knows, e.g. after
        # label-skewed shards (data.partition=by_label); test_acc_per_class once a test has run
        self.test_class_acc = MulticlassAccuracy(num_classes, average=None, validate_args=False)
        self.test_acc_per_class: list[float | None] | None = None
        # Training accuracy and loss are counted by psgd (count_train): correct, loss sum, samples,
        # reduced once per epoch.
        self._train_counts: list | None = None
        # the last epoch's counts, all workers' (epoch, correct, loss sum, samples): a checkpoint written
        # where that epoch was cut short keeps them, and the resumed run's rest of the epoch adds to them
        self._epoch_counts: tuple[int, float, float, float] | None = None
        self._resumed_counts: dict[str, float] | None = None
        # per-step schedules: this run's optimizer steps per epoch and the resumed checkpoint's
        self._steps_per_epoch: int | None = None
        self._resumed_steps_per_epoch: int | None = None
        self._train_pending: list[tuple[Tensor, Tensor, Tensor]] = []
        if per_worker_metrics:  # replicas differ (model averaging): also keep each worker's own numbers
            self.worker_val_acc = MulticlassAccuracy(
                num_classes, average="micro", validate_args=False, sync_on_compute=False
            )
            self.worker_val_loss = _loss_mean(sync_on_compute=False)

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
        if batch_idx == 0:
            # Lightning computes (over all workers) and resets a logged Metric object at epoch end from
            # everything it accumulated, so registering it once per epoch is enough
            self.log(f"{stage}/acc", acc, on_step=False, on_epoch=True)
            self.log(f"{stage}/loss", mean_loss, on_step=False, on_epoch=True)
        return loss, out

    @override
    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        out = self(x)
        loss = F.cross_entropy(out, y)
        self.count_train(out, y, loss, batch_idx)
        return loss

    # training batches kept before they are counted together (and logged as train/loss_step and
    # train/acc_step); None: the trainer's log_every_n_steps (50 by default)
    count_every: int | None = None

    def count_train(self, out: Tensor, y: Tensor, loss: Tensor, batch_idx: int) -> None:
        """Add a training batch to this epoch's accuracy and mean loss. The step only keeps its
        detached output, labels and loss; every `count_every` batches, and at the epoch's end, the
        kept ones are counted together (_count_pending) into [correct, loss sum] tensors and a
        sample count, which are reduced once per epoch (_log_train_epoch)."""
        if self._train_counts is None or batch_idx == 0:
            zero = torch.zeros((), dtype=torch.float64, device=out.device)
            self._train_counts = [zero, zero.clone(), 0]
            self._train_pending = []
            if self._resumed_counts is not None:
                self._carry_resumed_counts()
        pending = self._train_pending
        out = out.detach()
        if self._graph_outputs:  # a CUDA graph's replay overwrites its outputs: keep a copy of the kept ones
            out = out.clone()
        pending.append((out, y, loss.detach()))
        if len(pending) >= self._count_every:
            self._count_pending()

    _count_every = 32  # count_every as resolved at the start of fit
    _graph_outputs = False  # the network's outputs come from CUDA graphs (compile=reduce-overhead on GPU)

    def compile_net(self) -> None:
        """torch.compile the network in place (nn.Module.compile: its state_dict, checkpoints and the
        strategies' parameter handling are unchanged), once, in the worker that trains it; compiling
        itself happens at the first batch. Called at the start of fit, after Lightning's model summary
        ran its example input, which would otherwise be compiled too."""
        mode = self._compile_mode
        if not mode or self.net._compiled_call_impl is not None:  # (what nn.Module.compile sets)
            return
        self.net.compile(mode=mode)
        # reduce-overhead, and max-autotune on CUDA, replay CUDA graphs: a kept output would be overwritten
        self._graph_outputs = self.device.type == "cuda" and mode in ("reduce-overhead", "max-autotune")

    def _carry_resumed_counts(self) -> None:
        """Resumed inside an epoch a checkpoint was cut short in: that epoch's counts so far start this
        run's, on the first worker only (they are every worker's, and the epoch's counts are summed over
        the workers), so the epoch's train/loss and train/acc are the whole epoch's."""
        carried, self._resumed_counts = self._resumed_counts, None
        if carried.get("epoch") != self.current_epoch or self.global_rank != 0:
            return
        correct, loss_sum, _ = self._train_counts
        self._train_counts = [correct + carried["correct"], loss_sum + carried["loss_sum"], int(carried["samples"])]

    def _count_pending(self, after_step: bool = False) -> None:
        """Count the kept batches into the epoch's counts; on rank 0, also log their mean loss and
        accuracy (this worker's batches since the last count) as train/loss_step and train/acc_step:
        a curve within the epochs at one .item() per count, not Lightning's per-step self.log. They
        are placed at the (0-based) step of the last batch counted, as Lightning places its own:
        during that batch's training_step, or `after_step` it (the epoch's end)."""
        pending, counts = self._train_pending, self._train_counts
        if not pending:
            return
        outs, ys = torch.cat([p[0] for p in pending]), torch.cat([p[1] for p in pending])
        losses = torch.stack([p[2] for p in pending]).double()
        sizes = torch.tensor([len(p[1]) for p in pending], dtype=torch.float64, device=losses.device)
        correct, loss_sum = (outs.argmax(1) == ys).sum(), losses @ sizes
        counts[0] += correct
        counts[1] += loss_sum
        counts[2] += len(ys)
        pending.clear()
        trainer = self.trainer
        if trainer.is_global_zero and trainer.loggers:
            correct, loss_sum = torch.stack([correct.double(), loss_sum]).tolist()
            values = {"train/loss_step": loss_sum / len(ys), "train/acc_step": correct / len(ys)}
            for logger in trainer.loggers:
                logger.log_metrics(values, step=trainer.global_step - after_step)

    @override
    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        trainer = self.trainer
        if trainer.fit_loop.epoch_loop.batch_progress.is_last_batch or batch_idx + 1 >= trainer.num_training_batches:
            self._log_train_epoch()

    def finish_train_epoch(self) -> None:
        """For an epoch that ended before its last batch (an early stop after a validation inside the
        epoch, trainer.val_check_interval < 1, which every worker reaches at the same step): log its
        training accuracy and loss now. RunRecorder calls it at the epoch's end; a no-op when the last
        batch already did (it consumed the counts)."""
        if self._train_counts is not None:
            self._log_train_epoch()

    def _log_train_epoch(self) -> None:
        """Accuracy and mean loss over every sample every worker trained on this epoch, with one
        all-reduce after each worker's last step: every worker gets there once per epoch, also with
        shards of different sizes, and after any collective of its optimizer steps (averaging)."""
        self._count_pending(after_step=True)
        correct, loss_sum, n = self._train_counts
        self._train_counts = None  # logged; the next epoch's first batch starts new counts
        sums = torch.stack([correct, loss_sum, torch.tensor(float(n), dtype=torch.float64, device=correct.device)])
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(sums)
        correct, loss_sum, n = sums.tolist()
        self._epoch_counts = (self.current_epoch, correct, loss_sum, n)
        if not math.isfinite(loss_sum):
            # every worker has the same reduced sum, so all stop here together; NaN weights never
            # recover, and each further epoch would only cost time (and NaN warnings from the metrics)
            epoch = self.current_epoch + 1  # counted from 1, as the epoch lines and metrics.json's history count
            raise TrainingDiverged(
                f"training diverged: the mean training loss of epoch {epoch} is {loss_sum / max(n, 1)}; "
                + self._divergence_remedy()
            )
        # the same value on every worker; sync_dist (a mean of equal values) keeps Lightning's epoch
        # bookkeeping the same across ranks
        self.log("train/acc", correct / max(n, 1), on_step=False, on_epoch=True, sync_dist=True)
        self.log("train/loss", loss_sum / max(n, 1), on_step=False, on_epoch=True, sync_dist=True)

    def _divergence_remedy(self) -> str:
        """What to change after a diverged epoch (step_advice; HogWild's workers all write into one model)."""
        hogwild = hogwild_workers(getattr(self.trainer.strategy, "strategy_name", None), self.trainer.world_size)
        h = self.hparams
        return step_advice(h.lr, hogwild, h.get("optimizer_lr"), h.get("lr_by_workers", False))

    @override
    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        loss, out = self._step(batch, batch_idx, "val")
        if self.hparams.per_worker_metrics:  # the same output, kept unreduced for this worker
            self.worker_val_acc.update(out.detach(), batch[1])
            self.worker_val_loss.update(loss.detach(), weight=len(batch[1]))

    @override
    def on_validation_epoch_end(self) -> None:
        if not self.hparams.per_worker_metrics or self.trainer.sanity_checking:
            return
        mine = torch.stack([self.worker_val_acc.compute(), self.worker_val_loss.compute()]).to(torch.float64)
        self.worker_val_acc.reset()
        self.worker_val_loss.reset()
        everyone = [mine]  # one row per worker, the same on every worker
        if dist.is_available() and dist.is_initialized():
            everyone = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
            dist.all_gather(everyone, mine)
        for rank, (acc, loss) in enumerate(t.tolist() for t in everyone):
            self.log(f"worker/{rank}/val_acc", acc, on_epoch=True, sync_dist=True)
            self.log(f"worker/{rank}/val_loss", loss, on_epoch=True, sync_dist=True)

    @torch.no_grad()
    def evaluate(self, loader, max_batches: int | None = None) -> tuple[float, float]:
        """Accuracy and mean loss of this process's model over `loader` (its first `max_batches`
        batches; None: all), with no logging or communication, in the run's precision as Lightning's own
        evaluation has it: the input cast as its precision plugin casts a batch (64-true: float64 weights
        refused float32 images), the forward pass in its context (autocast for *-mixed)."""
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
        self._count_every = max(1, self.count_every or self.trainer.log_every_n_steps)
        self.compile_net()
        # A process group left over from an earlier job would silently change the world size.
        expected = self.hparams.workers * self.trainer.num_nodes
        actual = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        if actual != expected or self.trainer.world_size != expected:
            raise RuntimeError(
                f"world size is {actual} (trainer: {self.trainer.world_size}) but {expected} workers were "
                "configured; a stale process group from an earlier run in this process?"
            )

    @override
    def on_train_epoch_start(self) -> None:
        # at the epoch's first optimizer step, from which this lr is used (as lr_step places its values);
        # self.log would place it at the epoch's last step, an epoch late next to the losses
        lr = self.trainer.optimizers[0].param_groups[0]["lr"]
        for logger in self.loggers:  # rank 0 writes (Lightning's loggers log on rank 0 only)
            logger.log_metrics({"lr": lr}, step=self.trainer.global_step)

    def build_optimizer(self) -> torch.optim.Optimizer:
        """The run's optimizer over the network's parameters (its own param groups, if it has them)."""
        groups = self.net.param_groups() if hasattr(self.net, "param_groups") else self.net.parameters()
        return self.optimizer_factory(groups, lr=self.hparams.lr)

    @override
    def configure_optimizers(self):
        optimizer = self.build_optimizer()
        cfg = schedule_read(self.scheduler_cfg)  # (a constant lr has no interval: nothing to step)
        interval = cfg.pop("interval", "epoch")
        # per epoch, the scheduler is stepped once per epoch; per step, once per optimizer step
        self._steps_per_epoch = self.optimizer_steps_per_epoch() if interval == "step" else None
        self._check_resumed_steps()
        world = self.hparams.workers * self.trainer.num_nodes  # a warm-up from 1/workers: of all nodes' workers,
        # as lr_scaling multiplies by them all (workers is per node; 2 nodes of 2 started at twice the base lr)
        scheduler = build_scheduler(
            optimizer, world, self.hparams.max_epochs, steps_per_epoch=self._steps_per_epoch or 1, **cfg
        )
        if scheduler is None:
            return optimizer
        # named for TensorBoard: with interval=step, run.py's LearningRateMonitor logs it as lr_step
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": interval, "name": "lr_step"},
        }

    @override
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.trainer.optimizers:
            checkpoint[OPTIMIZER_KEY] = type(self.trainer.optimizers[0]).__name__
        if self._steps_per_epoch is not None:
            checkpoint[STEPS_PER_EPOCH_KEY] = self._steps_per_epoch
        if keep_a_cut_epoch_unfinished(checkpoint) and self._epoch_counts is not None:
            epoch, correct, loss_sum, n = self._epoch_counts
            if epoch == checkpoint["epoch"]:
                checkpoint[CUT_EPOCH_COUNTS_KEY] = {
                    "epoch": epoch,
                    "correct": correct,
                    "loss_sum": loss_sum,
                    "samples": n,
                }

    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._resumed_steps_per_epoch = checkpoint.get(STEPS_PER_EPOCH_KEY)
        self._resumed_counts = checkpoint.get(CUT_EPOCH_COUNTS_KEY)
        self._check_resumed_steps()
        self._update_as_configured(checkpoint)
        self._drop_states_of_callbacks_not_set(checkpoint)

    def _drop_states_of_callbacks_not_set(self, checkpoint: dict[str, Any]) -> None:
        """Drop the state of a callback psgd adds by a setting that this run lacks: the epoch checkpoints
        (checkpoint_every_epoch=true) and TargetAccuracyStop (early_stop.target_acc). Lightning, which
        restores callbacks after this hook, would tell the user to add the callback back."""
        states = checkpoint.get("callbacks")
        try:
            callbacks = self.trainer.callbacks
        except RuntimeError:  # not attached to a Trainer (load_from_checkpoint): no callbacks are restored
            return
        if not states:
            return
        present = {cb.state_key for cb in callbacks}
        by_setting = ("EpochCheckpoints{", "ModelCheckpoint{")  # (older psgd checkpoints name the epoch ones so)
        settings = [k for k in states if k.startswith(by_setting) or k == "TargetAccuracyStop"]
        for key in [k for k in settings if k not in present]:
            del states[key]

    def _update_as_configured(self, checkpoint: dict[str, Any]) -> None:
        """Give the checkpoint's param groups this run's settings of how torch runs the update
        (STEP_IMPLEMENTATION, e.g. optimizer.fused) before the optimizer loads them.

        Lightning restores the param groups wholesale, these settings included; set before the load, torch
        also places the state as this run's update needs it (Adam's step counts on the parameters' device
        for the fused one). What the update computes is compared before the run starts
        (run.optimizer_change) and stays the checkpoint's."""
        states = checkpoint.get("optimizer_states")
        if not states:
            return
        fresh = self.build_optimizer().param_groups  # no state: only its settings are read
        for state in states:
            for saved, group in zip(state.get("param_groups") or [], fresh):
                saved.update({k: group[k] for k in STEP_IMPLEMENTATION if k in group})

    def _check_resumed_steps(self) -> None:
        """A per-step schedule is restored in the checkpoint's optimizer steps: resumed with other steps
        per epoch it would follow the old run's epochs, not this run's. Checked once both are known:
        the checkpoint is loaded before configure_optimizers, or after it (model averaging), in every
        worker alike, so every worker gets here at the same point and they compare their counts
        together: all refuse with the same line (one worker alone refusing would leave the others to
        fail in their next collective, and that error could be the one reported)."""
        old, new = self._resumed_steps_per_epoch, self._steps_per_epoch
        if old is None or new is None:
            return
        counts = [(old, new)]
        distributed = dist.is_available() and dist.is_initialized()
        if distributed:
            counts = [None] * dist.get_world_size()
            dist.all_gather_object(counts, (old, new))
        for rank, (old, new) in enumerate(counts):
            if old != new:
                if distributed:
                    # every worker is here together: end the gloo group now, not at exit, where a peer
                    # that already left could make gloo abort this one with an extra stderr line
                    dist.destroy_process_group()
                raise ConfigError(
                    f"ckpt_path cannot be resumed with {new} optimizer steps per epoch on worker {rank} under "
                    f"scheduler.interval=step (the checkpoint's run had {old}: its lr schedule counts those "
                    "steps); resume with the checkpoint's data.batch_size, data.partition, workers, parallel_batches "
                    "and trainer settings"
                )

    def optimizer_steps_per_epoch(self) -> int:
        """This worker's optimizer steps per epoch (its shard's batches, after gradient accumulation,
        limit_train_batches and fast_dev_run), as Lightning will run them."""
        trainer = self.trainer
        trainer.estimated_stepping_batches  # noqa: B018 -- sets up the training data if not yet done
        return max(1, math.ceil(trainer.num_training_batches / trainer.accumulate_grad_batches))
