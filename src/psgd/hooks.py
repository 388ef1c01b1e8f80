"""Per-batch hooks that nobody implements, taken out of Lightning's hook dispatch.

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
from collections.abc import Iterable

import pytorch_lightning as L

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
    for `module`'s training-step hooks."""
    for callback in trainer.callbacks:
        skip_empty_hooks(callback)
    skip_empty_hooks(module, TRAINING_STEP_HOOKS)
