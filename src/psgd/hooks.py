"""Lightning's per-step hook work cut down: the per-batch hooks nobody implements taken out of its
dispatch (skip_unused_hooks), and the backward and optimizer-step hooks nobody implements not
dispatched at all (PlainPrecision), training_step's signature built once (fixed_signature), the hook
name Lightning writes around every hook call written plainly (PlainHookName), the batch hooks' owner
chosen once per fit (SelectedBatchHooks), and the Trainer's strategy and module read in one step
(Trainer).

Lightning calls every per-batch hook of every callback and of the LightningModule on every batch,
also where the object inherits the base class's empty one: six per training step in automatic
optimization (on_train_batch_start/_end, on_before_backward, on_after_backward,
on_before_optimizer_step, on_before_zero_grad). Each call costs a getattr, the profiler's context, the
callback's `state_key`, `trainer.lightning_module` through the strategy, two writes of the module's
`_current_fx_name` and the call itself. With psgd's callbacks, skipping the empty ones takes a
lab-CNN training step from 1103 to 849 Python calls (benchmarks/calls_per_step.py counts them).

Lightning skips a hook whose attribute is not callable (`_call_callback_hooks`,
`_call_lightning_module_hook`), and `is_overridden` reads such an attribute as not overridden. So
where an instance's hook has an empty body (inherited from Lightning's base class, or an override
that does nothing, as LatestCheckpoint's on_train_batch_end) that attribute is set to None on the
instance: the class, subclasses and `super()` calls are untouched, a hook with a body is kept, and
so is a base hook that gets a body in some later Lightning version. Code of one's own that calls
such a hook on the instance directly (Lightning calls them; user code rarely does) finds None there:
call it through the class or `super()`.
"""

import dis
import inspect
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from functools import cached_property
from typing import Any

import pytorch_lightning as L
from pytorch_lightning.plugins.precision import Precision
from pytorch_lightning.trainer import call
from pytorch_lightning.trainer.states import RunningStage
from pytorch_lightning.utilities.model_helpers import is_overridden

TRAINING_STEP_HOOKS = (
    "on_train_batch_start",
    "on_train_batch_end",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_before_zero_grad",
)
# Callbacks only: Lightning inspects a LightningModule's evaluation batch hooks' signatures
# (dataloader_idx) before it runs them, so the module keeps those.
PER_BATCH_HOOKS = TRAINING_STEP_HOOKS + (
    "on_validation_batch_start",
    "on_validation_batch_end",
    "on_test_batch_start",
    "on_test_batch_end",
    "on_predict_batch_start",
    "on_predict_batch_end",
)

_RETURNS_NONE = ([("LOAD_CONST", None), ("RETURN_VALUE", None)], [("RETURN_CONST", None)])


def does_nothing(fn) -> bool:
    """Whether `fn`'s body is empty (a docstring, `pass` or `...` at most): it only returns None."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return False
    ops = [(i.opname, i.argval) for i in dis.get_instructions(code) if i.opname not in ("RESUME", "NOP", "CACHE")]
    return ops in _RETURNS_NONE


def skip_empty_hooks(obj: object, hooks: Iterable[str] = PER_BATCH_HOOKS) -> list[str]:
    """Set each of `hooks` whose implementation on `obj`'s class does nothing (Lightning's empty base
    hook, or an override with an empty body) to None on `obj`, so that Lightning skips it. A hook
    set on the instance itself is kept. Returns the names skipped."""
    skipped = []
    for name in hooks:
        if name in vars(obj) or not does_nothing(getattr(type(obj), name, None)):
            continue
        setattr(obj, name, None)
        skipped.append(name)
    return skipped


def skip_unused_hooks(trainer: L.Trainer, module: L.LightningModule) -> None:
    """skip_empty_hooks for every callback of `trainer` (Lightning's own, psgd's and the user's) and
    for `module`'s training-step hooks; Lightning's full-precision plugin (32-true, the default) made a
    PlainPrecision."""
    for callback in trainer.callbacks:
        skip_empty_hooks(callback)
    skip_empty_hooks(module, TRAINING_STEP_HOOKS)
    if type(trainer.strategy.precision_plugin) is Precision:
        trainer.strategy.precision_plugin = PlainPrecision()


def implements(obj: object, hook: str) -> bool:
    """Whether `obj` has `hook` with a body: Lightning dispatches it (callable) and it does something."""
    fn = getattr(obj, hook, None)
    return callable(fn) and not does_nothing(fn)


def clips_only_with_a_value(fn: Callable) -> Callable:
    """Decorator for a LightningModule's configure_gradient_clipping that does nothing when the Trainer
    has no gradient_clip_val (None or 0), as Lightning's own: PlainPrecision then skips calling it."""
    fn.clips_only_with_a_value = True
    return fn


# the precision plugin's per-step hooks: called before and after each backward, and once the closure
# (training_step, backward) has run, before the optimizer's update
_PRECISION_HOOKS = ("on_before_backward", "on_after_backward", "on_before_optimizer_step")


class PlainPrecision(Precision):
    """Lightning's full-precision plugin (32-true) with its per-step work cut to what is used. Around every
    training step Lightning's plugin dispatches on_before_backward, on_after_backward and
    on_before_optimizer_step to every callback and to the module, and configure_gradient_clipping to the
    module, each through its hook machinery (a debug-log line formatted, the module's hook name written
    twice, a getattr per callback, the profiler's context), and wraps the closure and the training step's
    context in one more layer each. Where no callback and not the module implements a hook (with a
    body: psgd.hooks.does_nothing), this plugin does not dispatch it; where the module's gradient clipping
    is Lightning's own or marked clips_only_with_a_value and the Trainer has no clip value, it is not
    called. Everything else (an implemented hook, clipping, the optimizer's update) is Lightning's
    Precision, in the same order. Which hooks are implemented is read at the first step of each fit, after
    Lightning attached the module's own callbacks (configure_callbacks): `connect`, at each fit's setup,
    forgets the last fit's answer."""

    _calls: dict[str, bool] | None = None  # hook -> dispatched, for this fit

    def connect(self, model, optimizers, lr_schedulers):
        self._calls = None
        return super().connect(model, optimizers, lr_schedulers)

    def _dispatched(self, module: L.LightningModule) -> dict[str, bool]:
        trainer = module.trainer
        calls = {
            hook: implements(module, hook) or any(implements(c, hook) for c in trainer.callbacks)
            for hook in _PRECISION_HOOKS
        }
        clipping = getattr(module, "configure_gradient_clipping", None)
        calls["clipping"] = callable(clipping) and not (
            getattr(clipping, "clips_only_with_a_value", False)
            or getattr(clipping, "__func__", None) is L.LightningModule.configure_gradient_clipping
        )
        self._calls = calls
        return calls

    def pre_backward(self, tensor, module):
        calls = self._calls or self._dispatched(module)
        return super().pre_backward(tensor, module) if calls["on_before_backward"] else tensor

    def post_backward(self, tensor, module):
        calls = self._calls or self._dispatched(module)
        return super().post_backward(tensor, module) if calls["on_after_backward"] else tensor.detach()

    def optimizer_step(self, optimizer, model, closure, **kwargs):
        calls = self._calls or self._dispatched(model)
        if calls["on_before_optimizer_step"] or calls["clipping"] or model.trainer.gradient_clip_val:
            return super().optimizer_step(optimizer, model, closure, **kwargs)
        return optimizer.step(closure=closure, **kwargs)  # Lightning's, less its wrapper around the closure

    # Lightning's step contexts wrap forward_context in a generator of their own
    def train_step_context(self) -> AbstractContextManager:
        return self.forward_context()

    def val_step_context(self) -> AbstractContextManager:
        return self.forward_context()

    def test_step_context(self) -> AbstractContextManager:
        return self.forward_context()

    def predict_step_context(self) -> AbstractContextManager:
        return self.forward_context()


def fixed_signature(fn: Callable) -> Callable:
    """Decorator: `fn`'s signature, computed once. Lightning reads training_step's signature on every
    training step (`inspect.getfullargspec`, to learn whether it takes batch_idx), and inspect builds a
    new Signature each time, ~400 Python bytecodes a step; a function's `__signature__` is what inspect
    returns instead."""
    fn.__signature__ = inspect.signature(fn)
    return fn


class PlainHookName:
    """LightningModule mixin: Lightning sets `_current_fx_name` before and after every hook call, ~40
    times per training step; nn.Module.__setattr__ first looks the name up among parameters, buffers
    and submodules, which it never is: ~60 us per step (benchmarks/step_overhead.py). This writes that
    one attribute plainly; every other attribute goes through nn.Module as usual. A subclass may name
    more attributes written on every step in `plain_attributes` (never a parameter, buffer or submodule)."""

    plain_attributes = frozenset({"_current_fx_name"})

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.plain_attributes:
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)


# the batch hooks whose Lightning default returns the batch as it is
_PASS_THROUGH = ("on_before_batch_transfer", "on_after_batch_transfer")


class SelectedBatchHooks:
    """LightningModule mixin. Lightning calls three batch hooks on every step (on_before_batch_transfer,
    transfer_batch_to_device, on_after_batch_transfer) and, for each call, asks again whether the
    datamodule or the module implements it: up to two `is_overridden` per call, ~1000 Python bytecodes
    a step. Here Lightning's own choice (its `get_instance`, warnings and all) is made once per fit and
    kept; a pass-through hook that the chosen object leaves at Lightning's default (which returns the
    batch unchanged) is not called at all, and the others are called as Lightning calls them."""

    _batch_hooks: tuple[Any, dict[str, Any]] | None = None  # (the fit's hook selector, hook -> caller)

    def _call_batch_hook(self, hook_name: str, *args: Any) -> Any:
        trainer = self._trainer
        if trainer is None:
            return super()._call_batch_hook(hook_name, *args)
        selector = trainer._data_connector._datahook_selector
        kept = self._batch_hooks
        if kept is None or kept[0] is not selector:
            kept = self._batch_hooks = (selector, {})
        caller = kept[1].get(hook_name)
        if caller is None:
            obj = selector.get_instance(hook_name)
            if hook_name in _PASS_THROUGH and not is_overridden(hook_name, obj):
                caller = False
            elif isinstance(obj, self.__class__):
                caller = call._call_lightning_module_hook
            else:
                caller = call._call_lightning_datamodule_hook
            kept[1][hook_name] = caller
        if caller is False:
            return args[0]
        return caller(trainer, hook_name, *args)

    def __getstate__(self) -> dict[str, Any]:
        # the fit's selector holds its datamodule (and its data): a pickled or copied module leaves it, as
        # Lightning's own __getstate__ leaves the trainer
        state = super().__getstate__()
        state.pop("_batch_hooks", None)
        return state


class Trainer(L.Trainer):
    """Lightning's Trainer, with the three properties its own loop reads most made cheap. Every hook call
    reads `trainer.lightning_module`, which is `trainer.strategy.lightning_module`, three Python calls;
    with `trainer.strategy` read elsewhere too, that is ~80 of the ~800 Python calls of a lab-CNN
    training step (benchmarks/calls_per_step.py). The strategy is made once, in the Trainer's
    constructor, and never replaced, so here it is read once and kept on the instance; the module
    (set at the start of each fit) is read from it in one call, as Lightning's Strategy.lightning_module
    returns it (no strategy of Lightning's or psgd's overrides that). `training` is below. Everything
    else is Lightning's."""

    @cached_property
    def strategy(self):
        """Lightning's Trainer.strategy, kept after its first read."""
        return self._accelerator_connector.strategy

    @property
    def lightning_module(self) -> L.LightningModule:
        return self.strategy._lightning_module

    @property
    def training(self) -> bool:
        """Lightning's Trainer.training: whether the stage is training. Lightning compares the stage's name
        with RunningStage.TRAINING's, both lower-cased (LightningEnum.__eq__, five Python calls), and its loop
        reads this 13 times a step (each `trainer._results` reads it twice); a stage Lightning set is the
        enum member itself, so that is checked first."""
        stage = self.state.stage
        return stage is RunningStage.TRAINING or (type(stage) is not RunningStage and L.Trainer.training.fget(self))

    @training.setter
    def training(self, value: bool) -> None:
        L.Trainer.training.fset(self, value)
