"""Lightning's private API that psgd.strategies.lightning_internals uses is still there, as it is used.

A Lightning release that removes, renames or changes one of these fails here, naming it, before any
run deadlocks or names the wrong worker. pyproject.toml pins Lightning's minor release for them."""

import importlib
import inspect
import signal

import pytest
import pytorch_lightning as L
import torch
from pytorch_lightning.utilities.exceptions import SIGTERMException

from psgd.strategies.ddp import ReportsFirstFailure
from psgd.strategies.hogwild import HogwildStrategy
from psgd.strategies.lightning_internals import (
    FirstFailureLauncher,
    SharedMemoryLauncher,
    handle_sigterm_with,
    without_per_step_collectives,
)
from psgd.strategies.model_averaging import ModelAveragingStrategy

LAUNCHERS = "pytorch_lightning.strategies.launchers.multiprocessing"
# each private function or method used, with its parameters as lightning_internals calls or overrides it
SIGNATURES = {
    "pytorch_lightning.loops.training_epoch_loop._TrainingEpochLoop._broadcast_sigterm_tensor": ["self"],
    "pytorch_lightning.trainer.connectors.signal_connector._SignalConnector._sigterm_notifier_fn": [
        "self",
        "signum",
        "_",
    ],
    f"{LAUNCHERS}._MultiProcessingLauncher.__init__": ["self", "strategy", "start_method"],
    f"{LAUNCHERS}._MultiProcessingLauncher.launch": ["self", "function", "args", "trainer", "kwargs"],
    f"{LAUNCHERS}._MultiProcessingLauncher._wrapping_function": [
        "self",
        "process_idx",
        "trainer",
        "function",
        "args",
        "kwargs",
        "return_queue",
        "global_states",
    ],
    f"{LAUNCHERS}._MultiProcessingLauncher.get_extra_results": ["self", "trainer"],
    f"{LAUNCHERS}._MultiProcessingLauncher.update_main_process_results": ["self", "trainer", "extra"],
    f"{LAUNCHERS}._GlobalStateSnapshot.capture": [],
    f"{LAUNCHERS}._disable_module_memory_sharing": ["data"],
    "pytorch_lightning.strategies.ddp.DDPStrategy._configure_launcher": ["self"],
}
# where Lightning calls what psgd replaces: (function, the call in its source)
CALLS = {
    "pytorch_lightning.loops.training_epoch_loop._TrainingEpochLoop.advance": "self._broadcast_sigterm_tensor()",
    "pytorch_lightning.trainer.connectors.signal_connector._SignalConnector.register_signal_handlers": (
        "self._sigterm_notifier_fn"
    ),
    f"{LAUNCHERS}._MultiProcessingLauncher.launch": "self._wrapping_function",
}


def resolve(path: str):
    """The object at a dotted path (a module, then attributes), failing with the path's missing part."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for j, name in enumerate(parts[i:], start=i):
            if not hasattr(obj, name):
                pytest.fail(
                    f"Lightning {L.__version__} has no {'.'.join(parts[: j + 1])} (used by lightning_internals)"
                )
            obj = getattr(obj, name)
        return obj
    pytest.fail(f"cannot import {path}")


@pytest.mark.parametrize("path", SIGNATURES)
def test_each_private_function_psgd_uses_keeps_its_signature(path):
    params = list(inspect.signature(resolve(path)).parameters)
    assert params == SIGNATURES[path], f"Lightning {L.__version__} changed the signature of {path}: {params}"


@pytest.mark.parametrize("path", CALLS)
def test_lightning_still_calls_what_psgd_replaces_where_psgd_replaces_it(path):
    assert CALLS[path] in inspect.getsource(resolve(path)), (
        f"Lightning {L.__version__}'s {path} no longer uses {CALLS[path]}"
    )


def cpu_trainer(strategy, devices: int = 2) -> L.Trainer:
    return L.Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=devices,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


def test_the_launcher_attributes_psgd_reads_and_sets_are_lightnings():
    """DDPStrategy keeps its launcher in `_launcher`, its start method in `_start_method` and its
    process-group timeout in `_timeout`; the launcher its strategy in `_strategy`, its start method in
    `_start_method` and the started processes in `procs`."""
    for strategy, launcher in (
        (ReportsFirstFailure(start_method="spawn"), FirstFailureLauncher),
        (ModelAveragingStrategy(start_method="spawn"), FirstFailureLauncher),
        (HogwildStrategy(), SharedMemoryLauncher),
    ):
        trainer = cpu_trainer(strategy)
        assert type(trainer.strategy._launcher) is launcher, (strategy, "_launcher")
        assert trainer.strategy.launcher is trainer.strategy._launcher
        made = trainer.strategy._launcher
        assert made._strategy is strategy and made.procs == [], "_MultiProcessingLauncher._strategy, .procs"
        assert made._start_method == strategy._start_method, "_start_method"
        assert strategy._timeout.total_seconds() > 0, "DDPStrategy._timeout"
    assert SharedMemoryLauncher(HogwildStrategy())._start_method == "forkserver"


def test_the_training_loop_checks_sigterm_locally():
    trainer = cpu_trainer("auto", devices=1)
    without_per_step_collectives(trainer)
    check = trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor
    check()  # no SIGTERM received: nothing happens, and no collective is called
    trainer._signal_connector.received_sigterm = True  # what Lightning's own notifier sets
    assert trainer.received_sigterm
    with pytest.raises(SIGTERMException):
        check()


def test_lightning_registers_psgds_sigterm_handler_in_place_of_its_notifier():
    calls = []
    trainer = cpu_trainer("auto", devices=1)
    handle_sigterm_with(trainer, lambda signum, frame: calls.append(signum))
    before = signal.getsignal(signal.SIGTERM)
    try:
        trainer._signal_connector.register_signal_handlers()
        signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)
    finally:
        trainer._signal_connector.teardown()
        signal.signal(signal.SIGTERM, before)
    assert calls == [signal.SIGTERM] and not trainer.received_sigterm


def test_an_epochs_checkpoint_has_the_loop_state_as_finished_epoch_rewrites(tmp_path):
    """A checkpoint written in on_train_epoch_end (where ModelCheckpoint writes an epoch's) holds the fit loop's
    state in the layout as_finished_epoch rewrites: the epoch processed but not completed, the last batch's place;
    rewritten, it is a finished epoch's."""
    from pytorch_lightning.demos.boring_classes import BoringModel

    from psgd.strategies.lightning_internals import as_finished_epoch

    class SaveAtEpochEnd(L.Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            trainer.save_checkpoint(tmp_path / "epoch.ckpt")

    trainer = L.Trainer(
        max_epochs=1, limit_train_batches=3, limit_val_batches=0, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[SaveAtEpochEnd()],
    )  # fmt: skip
    trainer.fit(BoringModel())
    checkpoint = torch.load(tmp_path / "epoch.ckpt", weights_only=True)
    fit = checkpoint["loops"]["fit_loop"]
    batches = fit["epoch_loop.batch_progress"]
    assert batches["is_last_batch"] and batches["current"]["completed"] == 3
    assert fit["epoch_progress"]["current"]["processed"] == 1 != fit["epoch_progress"]["current"]["completed"]
    as_finished_epoch(checkpoint)
    assert fit["epoch_progress"]["current"]["completed"] == fit["epoch_progress"]["current"]["processed"] == 1
    assert not batches["is_last_batch"] and set(batches["current"].values()) == {0}
