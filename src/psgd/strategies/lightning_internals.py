"""Every use psgd makes of Lightning's private API, each needed for a run's correctness: the per-step SIGTERM
broadcast and Lightning's SIGTERM notifier (collectives that uneven shards deadlock in), and Lightning's
multiprocessing launcher (naming the worker whose failure ended a run, starting workers from psgd's fork
server, HogWild's model in shared memory), and the layout of a checkpoint's loop state (an epoch's checkpoint
resumed as a finished epoch). Each use names its Lightning source; a test checks each is still
there (tests/unit/test_lightning_internals.py), and pyproject.toml pins Lightning's minor release for them.
"""

import contextlib
import os
import shutil
import signal
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytorch_lightning as L
from pytorch_lightning.strategies.launchers.multiprocessing import (
    _disable_module_memory_sharing,
    _GlobalStateSnapshot,
    _MultiProcessingLauncher,
)
from pytorch_lightning.utilities.exceptions import SIGTERMException
from torch.multiprocessing import ProcessExitedException, ProcessRaisedException
from typing_extensions import override

from psgd import forkserver
from psgd.process import oom_kills, prepare_worker
from psgd.signals import ctrl_c_out_of_threading, die_with_parent
from psgd.strategies.workers import (
    REPORT_KEY,
    first_failure,
    out_of_memory,
    session_refusal,
)


def as_finished_epoch(checkpoint: dict[str, Any]) -> None:
    """Mark a checkpoint written at an epoch's last batch as one of a finished epoch, from which a resume starts the
    next one: the fit loop's epoch progress counted completed and its batch progress reset.

    Lightning writes an epoch's checkpoint inside on_train_epoch_end, before it counts the epoch completed: a resume
    under trainer.max_steps (its iteration-based training) replayed the epoch's end and went on with the next epoch
    from the last batch's place (Lightning issue #19617). The layout is _FitLoop.state_dict's:
    checkpoint["loops"]["fit_loop"] with "epoch_progress" and "epoch_loop.batch_progress"."""
    fit = checkpoint["loops"]["fit_loop"]
    batches = fit["epoch_loop.batch_progress"]
    if batches["is_last_batch"]:
        for count in fit["epoch_progress"].values():
            count["completed"] = count["processed"]
        batches["current"] = dict.fromkeys(batches["current"], 0)
        batches["is_last_batch"] = False


def without_per_step_collectives(trainer: L.Trainer) -> None:
    """Check for SIGTERM locally before each training step, for this trainer's loop only.

    Lightning's `_TrainingEpochLoop.advance` (loops/training_epoch_loop.py) calls
    `_broadcast_sigterm_tensor` before every step: a broadcast from rank 0 that workers with uneven
    shards deadlock in, and that swallows a lost peer's error."""
    loop = trainer.fit_loop.epoch_loop

    def local_sigterm_check() -> None:
        if getattr(trainer, "received_sigterm", False):
            raise SIGTERMException()

    loop._broadcast_sigterm_tensor = local_sigterm_check


def handle_sigterm_with(trainer: L.Trainer, handler: Callable[[int, Any], None]) -> None:
    """Have Lightning register `handler` for SIGTERM in place of its own notifier (call from `setup`).

    Lightning's `_SignalConnector.register_signal_handlers` (trainer/connectors/signal_connector.py)
    registers `_sigterm_notifier_fn`, which broadcasts a flag from rank 0 inside the signal handler: a
    collective the other workers never join (without_per_step_collectives)."""
    trainer._signal_connector._sigterm_notifier_fn = handler


class FirstFailureLauncher(_MultiProcessingLauncher):
    """Lightning's spawn/fork/forkserver launcher (strategies/launchers/multiprocessing.py), reporting the
    worker whose failure ended the run (first_failure) or that the OOM killer ended, and stopping the workers
    where psgd's fork server dies. A fork-server child gets what Lightning gives a spawned worker: its global state
    (`_GlobalStateSnapshot`) and a private copy of the model (`_disable_module_memory_sharing`)."""

    _private_models = True  # forkserver: each worker gets its own copy of the model, as with spawn
    _oom_kills_at_launch: int | None = None
    _launcher_state: dict[str, Any] | None = None
    _global_states: _GlobalStateSnapshot | None = None

    @property
    @override
    def is_interactive_compatible(self) -> bool:
        return True  # a notebook may launch: a class of the session's own is refused first (session_refusal)

    @override
    def launch(self, function: Callable, *args: Any, trainer: L.Trainer | None = None, **kwargs: Any) -> Any:
        for obj in (*args, *kwargs.values(), *getattr(trainer, "callbacks", [])):  # model, data, callbacks
            if refusal := session_refusal(obj):
                raise TypeError(refusal)
        # attributes set here are pickled into every worker
        self._errors_dir = tempfile.mkdtemp(prefix="psgd-worker-errors-")
        self._oom_kills_at_launch = oom_kills()
        if self._start_method == "forkserver":
            forkserver.start()  # unless the script started it already
            self._launcher_state = forkserver.launcher_state()
            self._global_states = _GlobalStateSnapshot.capture() if self._private_models else None
        try:
            return super().launch(function, *args, trainer=trainer, **kwargs)
        except (ProcessRaisedException, ProcessExitedException) as e:
            cause = self._explain(e)
            if cause is e:
                raise
            raise cause from e
        finally:
            shutil.rmtree(self._errors_dir, ignore_errors=True)

    @override
    def _wrapping_function(self, process_idx: int, *args: Any, **kwargs: Any) -> None:
        """In each worker: Lightning's entry point, with what a fork-server child lacks; its error recorded."""
        if self._launcher_state is not None:
            forkserver.adopt_launcher_state(self._launcher_state)
            if self._private_models and args:
                # Lightning passes (trainer, function, args, kwargs, return_queue[, global_states])
                trainer, function, fargs, fkwargs, return_queue = args[:5]
                fargs, fkwargs = _disable_module_memory_sharing((fargs, fkwargs))
                args = (trainer, function, fargs, fkwargs, return_queue, self._global_states)
        prepare_worker()
        die_with_parent()  # before the rendezvous: an orphan would wait out strategy.timeout_s
        ctrl_c_out_of_threading()
        try:
            super()._wrapping_function(process_idx, *args, **kwargs)
        except BaseException as e:
            if isinstance(e, Exception):  # its own error (Ctrl-C's KeyboardInterrupt is the user's)
                (Path(self._errors_dir) / str(process_idx)).write_text(traceback.format_exc())
            if args:  # tear the strategy down as a finished fit does (Lightning does so in the main process only),
                with contextlib.suppress(Exception):  # so that the process group ends before interpreter shutdown
                    args[0].strategy.teardown()
            raise

    @override
    def get_extra_results(self, trainer: L.Trainer) -> dict[str, Any]:
        """Rank 0's results for the launching process, with the strategy's `report`."""
        extra = super().get_extra_results(trainer)
        report = getattr(trainer.strategy, "report", None)
        if report:
            extra[REPORT_KEY] = report
        return extra

    @override
    def update_main_process_results(self, trainer: L.Trainer, extra: dict[str, Any]) -> None:
        report = extra.pop(REPORT_KEY, None)
        super().update_main_process_results(trainer, extra)
        if report is not None:
            trainer.strategy.report = report

    def _explain(self, e: ProcessRaisedException | ProcessExitedException) -> BaseException:
        """What the run raises for the failure torch reported: `e`, or the worker and cause behind it."""
        if self._launcher_state is not None and isinstance(e, ProcessExitedException) and e.exit_code == 255:
            # the fork server died (a worker's status is unknown then, exit code 255): its orphans would train on
            for proc in self.procs:
                with contextlib.suppress(OSError):
                    os.kill(proc.pid, signal.SIGKILL)
        if isinstance(e, ProcessRaisedException):
            timeout = getattr(self._strategy, "_timeout", None)  # DDPStrategy's process-group timeout
            e = first_failure(e, self.procs, self._errors_dir, timeout and timeout.total_seconds())
        return out_of_memory(e, self._oom_kills_at_launch)


class SharedMemoryLauncher(FirstFailureLauncher):
    """Starts workers from psgd's fork server without Lightning's cloning of module tensors, so that torch's
    reducers hand CPU storage over as shared memory (HogWild), once the strategy's `share()` has put what
    the workers share there (in the launching process, before any worker exists)."""

    _private_models = False

    def __init__(self, strategy: Any):
        super().__init__(strategy, start_method="forkserver")

    @override
    def launch(self, function: Callable, *args: Any, trainer: L.Trainer | None = None, **kwargs: Any) -> Any:
        self._strategy.share()
        return super().launch(function, *args, trainer=trainer, **kwargs)


class InThisProcess:
    """DDPStrategy mixin: no launcher, this process trains (simulated workers, psgd.strategies.simulated).
    Lightning's DDPStrategy._configure_launcher (strategies/ddp.py) makes a multiprocessing launcher for any device
    count, which would start the one process again as a worker."""

    def _configure_launcher(self) -> None:
        self._launcher = None


class FirstFailureLaunch:
    """DDPStrategy mixin: workers are started by FirstFailureLauncher (DDPStrategy._configure_launcher)."""

    def _configure_launcher(self) -> None:
        super()._configure_launcher()
        if type(self._launcher) is _MultiProcessingLauncher:
            self._launcher = FirstFailureLauncher(self, start_method=self._start_method)


class SharedMemoryLaunch:
    """DDPStrategy mixin: workers are started by SharedMemoryLauncher, after the strategy's `share()`."""

    def share(self) -> None:
        raise NotImplementedError

    def _configure_launcher(self) -> None:
        self._launcher = SharedMemoryLauncher(self)
