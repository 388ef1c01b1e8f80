"""psgd's per-worker settings: denormal flushing, the free profiler, Lightning's hook bookkeeping, the
empty hooks taken out of Lightning's dispatch, the process group's end."""

import pickle
from collections import Counter
from functools import partial

import pytest
import pytorch_lightning as L
import torch
import torch.nn.functional as F
from pytorch_lightning.profilers import PassThroughProfiler
from pytorch_lightning.utilities.model_helpers import is_overridden
from pytorch_lightning.utilities.signature_utils import is_param_in_hook_signature
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from psgd.callbacks import WorkerSetup, denormals_flushed
from psgd.hooks import does_nothing, skip_empty_hooks, skip_unused_hooks
from psgd.module import Classifier
from psgd.profiler import NoProfiler, PyTorchProfilerForWorkers

# a CPU Trainer with nothing of its own (no logger, checkpoints, progress bar or model summary); each test adds
# what it measures
QUIET = {
    "accelerator": "cpu",
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
}


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
    setup.setup(None, None, "fit")
    assert denormals_flushed() and torch.get_num_threads() == 1
    assert momentum_after_zero_grads(200) == 0.0  # flushed: exactly zero, every multiply fast again
    setup.teardown(None, None, "fit")
    assert not denormals_flushed()  # an in-process run leaves the caller's numerics as they were


def test_flush_denormal_false_keeps_ieee_denormals_for_the_run(restore_numerics):
    torch.set_flush_denormal(True)
    setup = WorkerSetup(threads=1, flush_denormal=False)
    setup.setup(None, None, "fit")
    assert not denormals_flushed() and momentum_after_zero_grads(200) > 0
    setup.teardown(None, None, "fit")
    assert denormals_flushed()


def test_no_profiler_hands_back_one_reusable_no_op_context():
    profiler = NoProfiler()
    first = profiler.profile("[Callback]a.on_train_batch_end")
    assert profiler.profile("[LightningModule]b.training_step") is first
    with first as outer, first as inner:  # Lightning nests hook calls
        assert outer is None and inner is None


def test_the_pytorch_profiler_psgd_uses_goes_to_worker_processes_with_its_settings():
    """Lightning's own holds torch's default schedule, a local function: pickling it into a worker (every
    run psgd starts workers for) failed. psgd's is pickled as its settings and made anew."""
    from pytorch_lightning.profilers import PyTorchProfiler

    with pytest.raises((AttributeError, pickle.PicklingError), match="local object"):
        pickle.dumps(PyTorchProfiler())
    sent = pickle.loads(pickle.dumps(PyTorchProfilerForWorkers(row_limit=7, sort_by_key="cpu_time_total")))
    assert type(sent) is PyTorchProfilerForWorkers and isinstance(sent, PyTorchProfiler)
    assert (sent._row_limit, sent._sort_by_key) == (7, "cpu_time_total")
    assert sent._schedule is not None  # its own default schedule, made in the worker


def test_classifier_keeps_lightnings_hook_name_out_of_its_state_but_registers_modules():
    module = Classifier(nn.Linear(3, 2), torch.optim.SGD, lr=0.1, num_classes=2)
    module._current_fx_name = "training_step"
    assert module._current_fx_name == "training_step"
    module.head = nn.Linear(2, 2)  # every other attribute still goes through nn.Module
    keys = set(module.state_dict())
    assert {"head.weight", "head.bias", "net.weight"} <= keys
    assert not any("fx_name" in k for k in keys)


class Counting(L.Callback):
    """Implements two per-step hooks and inherits Lightning's empty others."""

    def __init__(self):
        self.calls = Counter()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.calls["on_train_batch_end"] += 1

    def on_before_backward(self, trainer, module, loss):
        self.calls["on_before_backward"] += 1


class CountingChild(Counting):
    def on_train_batch_end(self, *args):
        super().on_train_batch_end(*args)  # the parent's hook, through the class
        self.calls["child"] += 1


def test_does_nothing_only_for_empty_bodies():
    def doc():
        """Only a docstring."""

    def passes(a, b):
        pass

    def dots(*args, **kwargs): ...

    def explicit():
        return None

    def returns():
        return 1

    def works(seen):
        seen.append(1)

    assert all(map(does_nothing, (doc, passes, dots, explicit, L.Callback.on_before_zero_grad)))
    assert not any(map(does_nothing, (returns, works, L.LightningModule.backward, len, Counting.on_before_backward)))


def test_only_empty_hooks_are_taken_out_inherited_or_overridden_and_only_on_the_instance():
    cb = CountingChild()
    skipped = skip_empty_hooks(cb)
    assert {"on_before_zero_grad", "on_after_backward", "on_train_batch_start", "on_validation_batch_end"} <= set(
        skipped
    )
    assert "on_train_batch_end" not in skipped and "on_before_backward" not in skipped
    assert cb.on_before_zero_grad is None and not is_overridden("on_before_zero_grad", cb)
    assert callable(CountingChild().on_before_zero_grad) and callable(L.Callback().on_before_zero_grad)

    mine = Counting()
    mine.on_after_backward = lambda *args: None  # set on the instance by its owner: kept
    assert "on_after_backward" not in skip_empty_hooks(mine)

    class Base:
        def on_train_batch_end(self, *args):
            self.seen = True

        def on_train_batch_start(self, *args):
            pass

    class Child(Base):
        def on_train_batch_start(self, *args):
            self.seen = False

    class Quiet(Base):
        def on_train_batch_end(self, *args):
            """Overridden to do nothing."""

    assert skip_empty_hooks(Child()) == []  # every hook it has does something: kept
    assert skip_empty_hooks(Quiet()) == ["on_train_batch_start", "on_train_batch_end"]


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 3)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def on_before_optimizer_step(self, optimizer):
        self.stepped = getattr(self, "stepped", 0) + 1

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5, momentum=0.9)


class Names(PassThroughProfiler):
    """Records the name of every hook call Lightning makes."""

    def __init__(self):
        super().__init__()
        self.names = Counter()

    def profile(self, action_name):
        self.names[action_name] += 1
        return super().profile(action_name)


def fit_tiny(skip: bool) -> tuple[Tiny, CountingChild, Counter]:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(40, 4), torch.randint(0, 3, (40,)))
    module, cb, profiler = Tiny(), CountingChild(), Names()
    trainer = L.Trainer(max_epochs=2, callbacks=[cb], profiler=profiler, **QUIET)
    if skip:
        skip_unused_hooks(trainer, module)
    trainer.fit(module, DataLoader(data, batch_size=8))
    return module, cb, profiler.names


def test_a_run_without_the_empty_hooks_calls_every_implemented_one_and_trains_the_same():
    plain, plain_cb, plain_calls = fit_tiny(skip=False)
    skipped, cb, calls = fit_tiny(skip=True)
    steps = 10  # 2 epochs of 5 batches
    assert cb.calls == plain_cb.calls == {"on_train_batch_end": steps, "on_before_backward": steps, "child": steps}
    assert skipped.stepped == plain.stepped == steps  # the module's own hook still runs
    for p, q in zip(plain.parameters(), skipped.parameters(), strict=True):
        assert torch.equal(p, q)
    # what is no longer dispatched: the inherited empty hooks of the callback and of the module
    assert plain_calls["[Callback]CountingChild.on_before_zero_grad"] == steps
    assert plain_calls["[LightningModule]Tiny.on_after_backward"] == steps
    assert "[Callback]CountingChild.on_before_zero_grad" not in calls
    assert "[LightningModule]Tiny.on_after_backward" not in calls
    assert calls["[Callback]CountingChild.on_before_backward"] == steps
    assert calls["[LightningModule]Tiny.on_before_optimizer_step"] == steps
    assert sum(calls.values()) < sum(plain_calls.values()) - 6 * steps


class Batches(L.LightningDataModule):
    """Four training batches of 8 (4 features, 3 classes), with Lightning's own batch hooks."""

    def __init__(self):
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        images, labels = torch.randn(32, 4, generator=generator), torch.randint(0, 3, (32,), generator=generator)
        self.data = TensorDataset(images, labels)
        self.after = 0

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=8)


class ShiftedBatches(Batches):
    """Its own on_after_batch_transfer (as a user's datamodule may have) shifts the images; it counts calls."""

    def on_after_batch_transfer(self, batch, dataloader_idx):
        self.after += 1
        return batch[0] + 0.5, batch[1]


class LightningsBatchHooks(Classifier):
    """Classifier with Lightning's own batch-hook dispatch: asked again on every call."""

    _call_batch_hook = L.LightningModule._call_batch_hook


def fit_classifier(module_class, datamodule) -> tuple[Classifier, Counter, int]:
    """Two epochs; the hook calls Lightning made, and how often it chose a batch hook's owner (the
    datamodule or the module: `get_instance`, up to two is_overridden each) after the first step."""
    from pytorch_lightning.trainer.connectors.data_connector import _DataHookSelector

    torch.manual_seed(0)
    module, profiler, chosen = module_class(nn.Linear(4, 3), torch.optim.SGD, lr=0.5, num_classes=3), Names(), []

    class AfterFirstStep(L.Callback):
        def on_train_batch_end(self, trainer, *args):
            chosen.append(0)

    def get_instance(self, hook_name):
        if chosen:
            chosen[-1] += 1
        return original(self, hook_name)

    original = _DataHookSelector.get_instance
    _DataHookSelector.get_instance = get_instance
    try:
        trainer = L.Trainer(
            max_epochs=2,
            callbacks=[AfterFirstStep()],
            limit_val_batches=0,
            profiler=profiler,
            **QUIET,
        )
        trainer.fit(module, datamodule=datamodule)
    finally:
        _DataHookSelector.get_instance = original
    return module, profiler.names, sum(chosen)


@pytest.mark.parametrize("datamodule", [Batches, ShiftedBatches])
def test_the_batch_hooks_are_chosen_once_per_fit_and_a_pass_through_default_is_not_called(datamodule):
    """Lightning asked, on every one of its three batch-hook calls per step, whether the datamodule or the
    module implements the hook (up to two is_overridden each). psgd's Classifier keeps the fit's choice,
    and leaves out on_before/after_batch_transfer where nobody overrides them: they return the batch."""
    steps = 8  # 2 epochs of 4 batches
    ours, calls, chosen = fit_classifier(Classifier, data := datamodule())
    theirs, their_calls, their_chosen = fit_classifier(LightningsBatchHooks, their_data := datamodule())
    assert chosen == 0 and their_chosen == 3 * (steps - 1)
    for p, q in zip(ours.parameters(), theirs.parameters(), strict=True):  # the same batches, the same training
        assert torch.equal(p, q)
    after = "[LightningDataModule]ShiftedBatches.on_after_batch_transfer"
    if datamodule is Batches:
        assert their_calls["[LightningModule]LightningsBatchHooks.on_before_batch_transfer"] == steps
        assert not any("on_before_batch_transfer" in k or "on_after_batch_transfer" in k for k in calls)
    else:  # the datamodule's own hook is called as Lightning calls it, every step
        assert calls[after] == their_calls[after] == steps and data.after == their_data.after == steps
    assert calls["[LightningModule]Classifier.transfer_batch_to_device"] == steps
    pickled = pickle.dumps(ours)  # as a module sent to worker processes: without the fit's datamodule and data
    assert "_batch_hooks" in vars(ours) and "_batch_hooks" not in vars(pickle.loads(pickled))
    assert type(data).__name__.encode() not in pickled


def test_lightning_reads_the_training_steps_signature_without_building_it_again():
    import inspect

    module = Classifier(nn.Linear(4, 3), torch.optim.SGD, lr=0.5, num_classes=3)
    built = Counter()
    original = inspect._signature_from_function

    def counted(*args, **kwargs):
        built["signature"] += 1
        return original(*args, **kwargs)

    inspect._signature_from_function = counted
    try:
        spec = inspect.getfullargspec(module.training_step)  # what Lightning asks on every training step
    finally:
        inspect._signature_from_function = original
    assert spec.args == ["self", "batch", "batch_idx"] and built["signature"] == 0
    assert is_param_in_hook_signature(module.training_step, "batch_idx", min_args=2)  # so batch_idx is passed


def one_clipped_step(clip: float | None, algorithm: str | None = None, plugin=None, cls=Classifier) -> torch.Tensor:
    """A Classifier's first SGD step (lr 1, no momentum) under Trainer(gradient_clip_val=clip): the
    weights' change, which is minus the gradient as it was clipped."""
    torch.manual_seed(0)
    net = nn.Linear(4, 3)
    before = torch.cat([p.detach().clone().flatten() for p in net.parameters()])
    module = cls(net, torch.optim.SGD, lr=1.0, num_classes=3)
    x, y = torch.randn(8, 4) * 10, torch.randint(0, 3, (8,))
    trainer = L.Trainer(max_steps=1, gradient_clip_val=clip, gradient_clip_algorithm=algorithm, plugins=plugin, **QUIET)
    trainer.fit(module, train_dataloaders=DataLoader(TensorDataset(x, y), batch_size=8))
    return torch.cat([p.detach().flatten() for p in net.parameters()]) - before


@pytest.mark.parametrize("plain", [False, True], ids=["lightnings-precision", "plain-precision"])
def test_gradients_are_clipped_as_the_trainer_says_and_left_alone_without_a_clip_value(plain):
    """Classifier skips Lightning's clipping call when there is nothing to clip (trainer.gradient_clip_val
    None or 0); with a value, Lightning clips as it does for any module. So does psgd's PlainPrecision,
    which also calls a module's own configure_gradient_clipping where the Trainer has no clip value."""
    from psgd.hooks import PlainPrecision

    step = partial(one_clipped_step, plugin=PlainPrecision() if plain else None)
    free = step(None)
    assert free.norm() > 1.0  # the step's whole gradient
    assert torch.equal(step(0), free)  # 0: no clipping, as Lightning reads it
    by_norm = step(0.5)
    assert by_norm.norm() == pytest.approx(0.5, rel=1e-4)
    assert torch.allclose(by_norm, free * 0.5 / free.norm(), atol=1e-6)  # the same direction, shortened
    by_value = step(0.01, "value")
    assert by_value.abs().max() == pytest.approx(0.01, rel=1e-4)
    assert torch.allclose(by_value, free.clamp(-0.01, 0.01), atol=1e-6)
    assert torch.equal(step(None, cls=OwnClipping), by_value)


class Reads(L.Callback):
    """What a Trainer's properties return at each training step, beside what Lightning's own return."""

    def __init__(self):
        self.seen = []

    def on_train_batch_start(self, trainer, pl_module, *args):
        self.seen.append((trainer.lightning_module, L.Trainer.lightning_module.fget(trainer), trainer.strategy))


def test_psgds_trainer_reads_the_strategy_and_module_lightning_set_up():
    """psgd.hooks.Trainer keeps the strategy after its first read and reads the module from it in one
    step: what Lightning's own properties return, before, during and after a fit, and after pickling
    (a spawned worker gets the Trainer pickled)."""
    from psgd.hooks import Trainer

    module = Classifier(nn.Linear(4, 3), torch.optim.SGD, lr=0.5, num_classes=3)
    trainer = Trainer(max_steps=2, callbacks=[reads := Reads()], **QUIET)
    lightnings = L.Trainer.strategy.fget(trainer)
    assert trainer.strategy is lightnings and trainer.lightning_module is None  # no module before fit
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    trainer.fit(module, train_dataloaders=DataLoader(TensorDataset(x, y), batch_size=4))
    assert reads.seen == [(module, module, lightnings)] * 2 and trainer.lightning_module is module
    copy = pickle.loads(pickle.dumps(trainer))
    assert type(copy.strategy) is type(lightnings) and copy.strategy is copy._accelerator_connector.strategy
    # the module is read as Strategy.lightning_module returns it: no strategy psgd runs gives it otherwise
    from pytorch_lightning.strategies import DDPStrategy, SingleDeviceStrategy, Strategy

    from psgd.strategies import HogwildStrategy, ModelAveragingStrategy
    from psgd.strategies._lightning import ReportsFirstFailure

    for cls in (SingleDeviceStrategy, DDPStrategy, ReportsFirstFailure, ModelAveragingStrategy, HogwildStrategy):
        assert cls.lightning_module is Strategy.lightning_module, cls


class GradsHeld(L.Callback):
    """Whether any gradient is allocated at the start and at the (callbacks') end of each training batch."""

    def __init__(self):
        self.at_start, self.at_end = [], []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.at_start.append(any(p.grad is not None for p in pl_module.parameters()))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.at_end.append(any(p.grad is not None for p in pl_module.parameters()))


class LightningZeroing(Classifier):
    """Classifier with Lightning's own zeroing: after the next forward pass, before its backward."""

    optimizer_step = L.LightningModule.optimizer_step
    optimizer_zero_grad = L.LightningModule.optimizer_zero_grad


def fit_with_zeroing(cls, accumulate: int, *callbacks: L.Callback) -> tuple[dict, GradsHeld]:
    """Two epochs of 7 batches (windows of `accumulate`, the epoch's last one short); the weights and
    whether gradients were held at each batch's start and end."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 4))
    module = cls(net, partial(torch.optim.SGD, momentum=0.9), lr=0.1, num_classes=4)
    x, y = torch.randn(56, 6), torch.randint(0, 4, (56,))
    held = GradsHeld()
    trainer = L.Trainer(max_epochs=2, accumulate_grad_batches=accumulate, callbacks=[held, *callbacks], **QUIET)
    trainer.fit(module, train_dataloaders=DataLoader(TensorDataset(x, y), batch_size=8))
    return net.state_dict(), held


@pytest.mark.parametrize("accumulate", [1, 3])
def test_gradients_are_freed_after_each_update_and_the_updates_are_lightnings(accumulate):
    """psgd zeroes the gradients at the end of each batch that stepped the optimizer (Lightning: after
    the next forward pass), so no batch's forward pass holds the last update's gradients; callbacks
    still see them in on_train_batch_end, and the weights come out bit for bit as with Lightning's
    zeroing, with gradient accumulation too (windows 0-2, 3-5 and the epoch's last batch alone)."""
    weights, held = fit_with_zeroing(Classifier, accumulate)
    lightning_weights, lightning_held = fit_with_zeroing(LightningZeroing, accumulate)
    assert all(torch.equal(weights[k], lightning_weights[k]) for k in weights)
    window_start = [i % 7 % accumulate == 0 for i in range(14)]
    assert held.at_start == [not start for start in window_start]  # only inside an accumulation window
    assert lightning_held.at_start == [i > 0 for i in range(14)]  # Lightning's: from the first backward on
    assert held.at_end == lightning_held.at_end == [True] * 14


class OwnBackward(L.Callback):
    """A callback with a backward of its own at each batch's start (a probe, an auxiliary loss)."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        (pl_module.net[0].weight.sum() * 100).backward()


@pytest.mark.parametrize("accumulate", [1, 3])
def test_gradients_a_callback_leaves_before_the_backward_are_treated_as_lightning_treats_them(accumulate):
    """Lightning zeroes at each window's start, after the forward pass: a callback's gradients from before
    it are dropped there and kept inside a window. psgd zeroes them there too, though its own zeroing
    happened after the last update: the weights are Lightning's (and far from them if those gradients
    reached the update)."""
    weights, _ = fit_with_zeroing(Classifier, accumulate, OwnBackward())
    lightning_weights, _ = fit_with_zeroing(LightningZeroing, accumulate, OwnBackward())
    clean_weights, _ = fit_with_zeroing(Classifier, accumulate)
    assert all(torch.equal(weights[k], lightning_weights[k]) for k in weights)
    assert torch.equal(weights["0.weight"], clean_weights["0.weight"]) == (accumulate == 1)


class Stages(L.Callback):
    """psgd's Trainer.training beside Lightning's own, at each training and validation batch (the sanity
    check's too)."""

    def __init__(self):
        self.seen = []

    def _read(self, trainer):
        self.seen.append((trainer.training, L.Trainer.training.fget(trainer)))

    def on_train_batch_start(self, trainer, *args):
        self._read(trainer)

    def on_validation_batch_start(self, trainer, *args):
        self._read(trainer)


def test_psgds_trainer_tells_training_as_lightning_does():
    """psgd.hooks.Trainer.training (Lightning's loop reads it 13 times a step) answers as Lightning's
    property in training, validation (its sanity check too), outside a fit, for a stage set as its name,
    and its setter sets the stage as Lightning's does."""
    from pytorch_lightning.trainer.states import RunningStage

    from psgd.hooks import Trainer

    module = Classifier(nn.Linear(4, 3), torch.optim.SGD, lr=0.5, num_classes=3)
    loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randint(0, 3, (8,))), batch_size=4)
    trainer = Trainer(max_steps=2, callbacks=[stages := Stages()], num_sanity_val_steps=1, **QUIET)
    trainer.fit(module, train_dataloaders=loader, val_dataloaders=loader)
    assert stages.seen == [(False, False), (True, True), (True, True), (False, False), (False, False)]
    assert trainer.training is L.Trainer.training.fget(trainer) is False  # after the fit
    for stage in (*RunningStage, "train", "TRAIN", "validate", None):
        trainer.state.stage = stage
        assert trainer.training is L.Trainer.training.fget(trainer), stage
    trainer.training = True
    assert trainer.state.stage is RunningStage.TRAINING and trainer.training
    trainer.training = False
    assert trainer.state.stage is None and not trainer.training


class Recorder(L.Callback):
    """Lightning's three backward and optimizer-step hooks, each recording what it sees: the loss, and the
    gradients' norm after the backward and before the update."""

    def __init__(self):
        self.seen = []

    def on_before_backward(self, trainer, module, loss):
        self.seen.append(("on_before_backward", loss.item()))

    def on_after_backward(self, trainer, module):
        self.seen.append(("on_after_backward", grad_norm(module)))

    def on_before_optimizer_step(self, trainer, module, optimizer):
        self.seen.append(("on_before_optimizer_step", grad_norm(module)))


def grad_norm(module: nn.Module) -> float:
    return torch.cat([p.grad.flatten() for p in module.parameters()]).norm().item()


class AfterBackward(L.Callback):
    def __init__(self):
        self.norms = []

    def on_after_backward(self, trainer, module):
        self.norms.append(grad_norm(module))


class OwnHooks(Tiny):
    """Tiny, manual optimization optional, that attaches an AfterBackward of its own (configure_callbacks)."""

    def __init__(self, manual: bool = False, own_callback: bool = False):
        super().__init__()
        self.automatic_optimization = not manual
        self.own = AfterBackward() if own_callback else None

    def training_step(self, batch, batch_idx):
        if self.automatic_optimization:
            return super().training_step(batch, batch_idx)
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(super().training_step(batch, batch_idx))
        opt.step()

    def configure_callbacks(self):
        return [self.own] if self.own is not None else []


def fit_recorded(plugin, manual=False, callbacks=(), own_callback=False, steps=6) -> tuple[OwnHooks, Counter]:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(24, 4), torch.randint(0, 3, (24,)))
    module, names = OwnHooks(manual, own_callback), Names()
    trainer = L.Trainer(max_steps=steps, callbacks=list(callbacks), profiler=names, plugins=plugin, **QUIET)
    trainer.fit(module, DataLoader(data, batch_size=4))
    return module, names.names


@pytest.mark.parametrize("manual", [False, True], ids=["automatic", "manual"])
def test_plain_precision_calls_the_implemented_hooks_as_lightning_does_and_trains_the_same(manual):
    """PlainPrecision (psgd's plugin for 32-true) calls the backward and optimizer-step hooks a callback or
    the module implements, in Lightning's order and seeing what they see under Lightning's plugin, and
    dispatches none that nobody implements; the weights are Lightning's bit for bit."""
    from pytorch_lightning.plugins.precision import Precision

    from psgd.hooks import PlainPrecision

    lightnings, ours = Recorder(), Recorder()
    plain, plain_names = fit_recorded(Precision(), manual, [lightnings])
    module, names = fit_recorded(PlainPrecision(), manual, [ours])
    assert len(ours.seen) == 3 * 6 and [h for h, _ in ours.seen[:3]] == [h for h, _ in lightnings.seen[:3]]
    assert ours.seen == lightnings.seen
    assert module.stepped == plain.stepped == 6  # Tiny's own on_before_optimizer_step
    for p, q in zip(plain.parameters(), module.parameters(), strict=True):
        assert torch.equal(p, q)
    # with no implementation anywhere, the hook is not dispatched at all
    bare, bare_names = fit_recorded(PlainPrecision(), manual)
    _, lightning_bare_names = fit_recorded(Precision(), manual)
    assert lightning_bare_names["[LightningModule]OwnHooks.on_after_backward"] == 6
    assert "[LightningModule]OwnHooks.on_after_backward" not in bare_names
    assert "[LightningModule]OwnHooks.on_before_backward" not in bare_names
    assert bare_names["[LightningModule]OwnHooks.on_before_optimizer_step"] == 6  # Tiny implements it
    for p, q in zip(plain.parameters(), bare.parameters(), strict=True):
        assert torch.equal(p, q)


def test_plain_precision_reads_each_fits_callbacks_also_those_the_module_attaches():
    """Which hooks are implemented is read per fit, after Lightning attached the module's own callbacks: one
    plugin, used in a fit without any, then in one with a module's callback and a trainer's, calls them."""
    from psgd.hooks import PlainPrecision

    plugin = PlainPrecision()
    fit_recorded(plugin)
    module, names = fit_recorded(plugin, own_callback=True, steps=4)
    assert len(module.own.norms) == 4 and all(n > 0 for n in module.own.norms)
    later = AfterBackward()
    fit_recorded(plugin, callbacks=[later], steps=3)
    assert len(later.norms) == 3


def test_psgd_takes_plain_precision_for_32_bit_runs_only():
    """skip_unused_hooks (psgd's run calls it on its Trainer) puts PlainPrecision in place of Lightning's
    32-true plugin; other precisions keep Lightning's own plugin."""
    from pytorch_lightning.plugins.precision import DoublePrecision, MixedPrecision

    from psgd.hooks import PlainPrecision

    kept = {}
    for precision in ("32-true", "bf16-mixed", "64-true"):
        trainer = L.Trainer(precision=precision, **QUIET)
        skip_unused_hooks(trainer, Tiny())
        kept[precision] = type(trainer.strategy.precision_plugin)
    assert kept == {"32-true": PlainPrecision, "bf16-mixed": MixedPrecision, "64-true": DoublePrecision}


class OwnClipping(Classifier):
    """Clips by value in its own configure_gradient_clipping, with no clip value on the Trainer."""

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        self.clip_gradients(optimizer, 0.01, "value")
