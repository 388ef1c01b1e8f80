"""The LightningModule and per-worker settings: the training accuracy and loss a run reports are those of
every sample it trained on; gradient clipping as the Trainer says; denormal flushing
in worker processes."""

from functools import partial

import pytest
import pytorch_lightning as L
import torch
import torch.nn.functional as F
from pytorch_lightning.loggers import Logger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from psgd.callbacks import WorkerSetup, denormals_flushed
from psgd.module import Classifier


def fit_one_epoch(limit_train_batches=None, count_every=None):
    torch.manual_seed(0)
    x, y = torch.randn(100, 6), torch.randint(0, 4, (100,))
    net = nn.Linear(6, 4)
    # lr 0: the weights stay as they are, so the epoch's numbers can be recomputed afterwards
    module = Classifier(net, partial(torch.optim.SGD), lr=0.0, num_classes=4)
    loader = DataLoader(TensorDataset(x, y), batch_size=32)  # 32 + 32 + 32 + 4: a short last batch
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_train_batches=limit_train_batches,
        log_every_n_steps=50 if count_every is None else count_every,
    )
    trainer.fit(module, train_dataloaders=loader)
    return trainer.callback_metrics, net, x, y


@pytest.mark.parametrize("batches", [None, 2], ids=["whole epoch", "limit_train_batches=2"])
@pytest.mark.parametrize("count_every", [None, 1, 3], ids=["default", "counted every batch", "counted every 3"])
def test_train_metrics_count_every_sample_of_the_epoch(batches, count_every):
    """Also when the kept batches are counted within the epoch (every 3: after batch 3, then the
    short last one at the epoch's end)."""
    metrics, net, x, y = fit_one_epoch(batches, count_every)
    n = 100 if batches is None else 64
    with torch.no_grad():
        out = net(x[:n])
    assert float(metrics["train/acc"]) == pytest.approx((out.argmax(1) == y[:n]).float().mean().item(), abs=1e-6)
    assert float(metrics["train/loss"]) == pytest.approx(F.cross_entropy(out, y[:n]).item(), rel=1e-5)


class Recorded(Logger):
    """A logger that keeps what it is given, as TensorBoard's would write it."""

    def __init__(self):
        super().__init__()
        self.logged: dict[str, dict[int, float]] = {}

    name, version = "recorded", 0

    def log_metrics(self, metrics, step=None):
        for key, value in metrics.items():
            self.logged.setdefault(key, {})[step] = value

    def log_hyperparams(self, params, *args, **kwargs):
        pass


def test_the_loss_within_the_epoch_is_logged_every_log_every_n_steps():
    """train/loss_step and train/acc_step: the mean over the batches since the last point, at the
    0-based step of the last of them, every trainer.log_every_n_steps batches and at the epoch's end."""
    torch.manual_seed(0)
    x, y = torch.randn(100, 6), torch.randint(0, 4, (100,))
    net = nn.Linear(6, 4)
    module = Classifier(net, partial(torch.optim.SGD), lr=0.0, num_classes=4)  # lr 0: recomputable
    logger = Recorded()
    trainer = L.Trainer(
        max_epochs=2,
        accelerator="cpu",
        logger=logger,
        log_every_n_steps=3,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, train_dataloaders=DataLoader(TensorDataset(x, y), batch_size=32))  # 4 batches
    with torch.no_grad():
        out = net(x)
    parts = {"first": slice(0, 96), "rest": slice(96, 100)}  # batches 1-3, then the short 4th at the end
    loss = {k: F.cross_entropy(out[s], y[s]).item() for k, s in parts.items()}
    acc = {k: (out[s].argmax(1) == y[s]).float().mean().item() for k, s in parts.items()}
    steps = {2: "first", 3: "rest", 6: "first", 7: "rest"}  # 4 steps per epoch, 0-based
    assert logger.logged["train/loss_step"] == pytest.approx({step: loss[k] for step, k in steps.items()})
    assert logger.logged["train/acc_step"] == pytest.approx({step: acc[k] for step, k in steps.items()})
    # the epoch's own figures are over all of it, at its last step, as before
    assert logger.logged["train/loss"] == pytest.approx(
        {3: F.cross_entropy(out, y).item(), 7: F.cross_entropy(out, y).item()}
    )


def test_the_test_reports_each_classs_accuracy_and_none_for_a_class_it_never_saw():
    """metrics.json's test_acc_per_class: the share of each class's test samples the final model got
    right, which shows a model that knows only some labels (label-skewed shards) behind its test_acc."""
    torch.manual_seed(0)
    x, y = torch.randn(90, 6), torch.tensor([0] * 40 + [1] * 30 + [2] * 20)  # class 3: no test sample
    net = nn.Linear(6, 4)
    with torch.no_grad():  # predicts class 0 for x[:, 0] > 0, else class 1; never 2 or 3
        net.weight.zero_(), net.bias.zero_()
        net.weight[0, 0], net.weight[1, 0] = 1.0, -1.0
    module = Classifier(net, partial(torch.optim.SGD), lr=0.0, num_classes=4)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    (tested,) = trainer.test(module, DataLoader(TensorDataset(x, y), batch_size=32), verbose=False)
    pred = torch.where(x[:, 0] > 0, 0, 1)
    expected = [((pred == y) & (y == c)).sum().item() / (y == c).sum().item() for c in range(3)]
    assert 0.2 < expected[0] < 0.8 and 0.2 < expected[1] < 0.8 and expected[2] == 0  # not a trivial case
    assert module.test_acc_per_class == pytest.approx([*expected, None])
    # the per-class figures weighted by each class's samples make up test_acc
    assert tested["test/acc"] == pytest.approx((expected[0] * 40 + expected[1] * 30) / 90)


def test_the_validation_loss_is_the_mean_over_samples_and_keeps_a_nan_batch(recwarn):
    """val/loss weighs each batch by its samples (64 + 6 here), and a batch whose loss is NaN makes it
    NaN (torchmetrics' default would drop that batch with a UserWarning, and a diverging model's val_loss
    would be the mean of its finite batches alone)."""
    torch.manual_seed(0)
    x, y = torch.randn(70, 6), torch.randint(0, 4, (70,))
    net = nn.Linear(6, 4)
    module = Classifier(net, partial(torch.optim.SGD), lr=0.0, num_classes=4)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    loader = partial(DataLoader, batch_size=64)  # a full batch and a short one of 6
    (validated,) = trainer.validate(module, loader(TensorDataset(x, y)), verbose=False)
    with torch.no_grad():
        expected = F.cross_entropy(net(x), y).item()
    assert validated["val/loss"] == pytest.approx(expected, rel=1e-5)
    x[66, 2] = float("nan")  # one sample of the short batch: its loss is NaN
    (validated,) = trainer.validate(module, loader(TensorDataset(x, y)), verbose=False)
    assert validated["val/loss"] != validated["val/loss"]  # NaN, not the first batch's mean alone
    assert not [w for w in recwarn if "nan" in str(w.message).lower()]


@pytest.mark.parametrize("precision", ["32-true", "64-true", "bf16-true", "bf16-mixed"])
def test_evaluate_runs_in_the_trainers_precision(precision):
    """Model averaging evaluates each replica with Classifier.evaluate, outside Lightning's loops: with
    64-true (or bf16-true, 16-true) its float32 images met the cast weights and every such run failed
    at its end ("Input type (float) and bias type (double) should be the same")."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
    module = Classifier(net, partial(torch.optim.SGD), lr=0.1, num_classes=3)
    trainer = L.Trainer(accelerator="cpu", precision=precision, logger=False, enable_progress_bar=False)
    module.trainer = trainer
    module = trainer.precision_plugin.convert_module(module)  # the weights cast as Lightning casts them
    x, y = torch.randn(10, 1, 8, 8), torch.randint(0, 3, (10,))
    acc, loss = module.evaluate(DataLoader(TensorDataset(x, y), batch_size=4))
    with torch.no_grad():
        out = module(x.to(next(module.parameters()).dtype)).float()
    rough = "bf16" in precision  # a bf16 forward pass against this float one: an argmax may flip
    assert acc == pytest.approx((out.argmax(1) == y).sum().item() / len(y), abs=0.1 if rough else 1e-9)
    assert loss == pytest.approx(F.cross_entropy(out, y).item(), rel=0.05 if rough else 1e-5)


def test_a_compiled_network_is_compiled_in_place_at_fit_and_trains_as_the_eager_one():
    """compile=true: the network is compiled in place at the start of fit, in the worker, so its
    state_dict (what checkpoints, model averaging and HogWild read) keeps the eager keys, and it
    trains to the eager network's weights and training figures (no dropout here: compiled dropout
    draws other random numbers)."""
    torch.manual_seed(0)
    x, y = torch.randn(96, 6), torch.randint(0, 4, (96,))
    start = nn.Linear(6, 4).state_dict()
    fitted = {}
    for mode in (None, "default"):
        net = nn.Linear(6, 4)
        net.load_state_dict(start)
        module = Classifier(net, partial(torch.optim.SGD), lr=0.5, num_classes=4, compile=mode)
        assert net._compiled_call_impl is None  # not before fit: the workers get the eager network pickled
        trainer = L.Trainer(
            max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False,
        )  # fmt: skip
        trainer.fit(module, train_dataloaders=DataLoader(TensorDataset(x, y), batch_size=32))
        assert (net._compiled_call_impl is not None) == (mode is not None)
        fitted[mode] = net.state_dict(), trainer.callback_metrics
    (eager, eager_metrics), (compiled, compiled_metrics) = fitted[None], fitted["default"]
    assert list(compiled) == list(eager) == ["weight", "bias"]  # no _orig_mod. prefix
    assert not torch.allclose(compiled["weight"], start["weight"])  # it trained
    assert all(torch.allclose(compiled[k], eager[k], atol=1e-5) for k in eager)
    assert compiled_metrics["train/acc"] == eager_metrics["train/acc"]
    assert compiled_metrics["train/loss"] == pytest.approx(eager_metrics["train/loss"].item(), abs=1e-5)


# a CPU Trainer with nothing of its own (no logger, checkpoints, progress bar or model summary)
QUIET = {
    "accelerator": "cpu",
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
}


def one_clipped_step(clip: float | None, algorithm: str | None = None, cls=Classifier) -> torch.Tensor:
    """A Classifier's first SGD step (lr 1, no momentum) under Trainer(gradient_clip_val=clip): the
    weights' change, which is minus the gradient as it was clipped."""
    torch.manual_seed(0)
    net = nn.Linear(4, 3)
    before = torch.cat([p.detach().clone().flatten() for p in net.parameters()])
    module = cls(net, torch.optim.SGD, lr=1.0, num_classes=3)
    x, y = torch.randn(8, 4) * 10, torch.randint(0, 3, (8,))
    trainer = L.Trainer(max_steps=1, gradient_clip_val=clip, gradient_clip_algorithm=algorithm, **QUIET)
    trainer.fit(module, train_dataloaders=DataLoader(TensorDataset(x, y), batch_size=8))
    return torch.cat([p.detach().flatten() for p in net.parameters()]) - before


class OwnClipping(Classifier):
    """Clips by value in its own configure_gradient_clipping, with no clip value on the Trainer."""

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        self.clip_gradients(optimizer, 0.01, "value")


def test_gradients_are_clipped_as_the_trainer_says_and_left_alone_without_a_clip_value():
    free = one_clipped_step(None)
    assert free.norm() > 1.0  # the step's whole gradient
    assert torch.equal(one_clipped_step(0), free)  # 0: no clipping, as Lightning reads it
    by_norm = one_clipped_step(0.5)
    assert by_norm.norm() == pytest.approx(0.5, rel=1e-4)
    assert torch.allclose(by_norm, free * 0.5 / free.norm(), atol=1e-6)  # the same direction, shortened
    by_value = one_clipped_step(0.01, "value")
    assert by_value.abs().max() == pytest.approx(0.01, rel=1e-4)
    assert torch.allclose(by_value, free.clamp(-0.01, 0.01), atol=1e-6)
    assert torch.equal(one_clipped_step(None, cls=OwnClipping), by_value)  # a subclass's own clipping


@pytest.fixture
def restore_numerics():
    threads, flushed = torch.get_num_threads(), denormals_flushed()
    yield
    torch.set_num_threads(threads)
    torch.set_flush_denormal(flushed)


def momentum_after_zero_grads(steps: int) -> float:
    """A weight whose unit gets no gradient (a dead ReLU): SGD keeps multiplying its momentum by 0.9."""
    w = nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([w], lr=0.1, momentum=0.9)
    w.grad = torch.full((1,), 1e-30)
    opt.step()
    for _ in range(steps):
        w.grad = torch.zeros(1)
        opt.step()
    return opt.state[w]["momentum_buffer"].item()


def test_worker_setup_flushes_denormals_in_training_and_restores_the_mode(restore_numerics):
    torch.set_flush_denormal(False)
    assert 0 < momentum_after_zero_grads(200) < 1.2e-38  # without: the buffer sits in the slow range
    setup = WorkerSetup(threads=1)
    setup.setup(L.Trainer(**QUIET), None, "fit")
    assert denormals_flushed() and torch.get_num_threads() == 1
    assert momentum_after_zero_grads(200) == 0.0  # flushed: exactly zero, every multiply fast again
    setup.teardown(None, None, "fit")
    assert not denormals_flushed()  # an in-process run leaves the caller's numerics as they were


def test_flush_denormal_false_keeps_ieee_denormals_for_the_run(restore_numerics):
    torch.set_flush_denormal(True)
    setup = WorkerSetup(threads=1, flush_denormal=False)
    setup.setup(L.Trainer(**QUIET), None, "fit")
    assert not denormals_flushed() and momentum_after_zero_grads(200) > 0
    setup.teardown(None, None, "fit")
    assert denormals_flushed()
