"""The one place psgd touches Lightning's private API: its multiprocessing launcher (which worker a
failure is reported for; HogWild's shared memory) and the training loop's per-step SIGTERM broadcast.
Keep this file small; it is what a Lightning upgrade may break."""

import atexit
import contextlib
import os
import pickle
import re
import shutil
import signal
import sys
import traceback
import types
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as L
import torch
import torch.distributed as dist
from pytorch_lightning.strategies import DDPStrategy
from pytorch_lightning.strategies.launchers.multiprocessing import (
    _disable_module_memory_sharing,
    _GlobalStateSnapshot,
    _MultiProcessingLauncher,
)
from pytorch_lightning.utilities.exceptions import SIGTERMException
from torch.multiprocessing import ProcessExitedException, ProcessRaisedException
from typing_extensions import override

from psgd import forkserver
from psgd.module import STEPS_PER_EPOCH_KEY
from psgd.process import prepare_worker
from psgd.results import say
from psgd.signals import (
    ctrl_c_out_of_threading,
    die_with_parent,
    hang_up_as_sigterm,
    oom_kills,
    oom_kills_since,
    temp_folder_of_this_process,
)
from psgd.strategies.allreduce_timing import TimesAllReduce

REPORT_KEY = "psgd_strategy_report"  # a checkpoint's copy of the strategy's final figures (`report`)

__all__ = [
    "FirstFailureLauncher",
    "ForkServerDied",
    "GroupEndsAtExit",
    "KilledWorker",
    "ReportsFirstFailure",
    "SharedMemoryLauncher",
    "WorkerOutOfMemory",
    "WorkerUnresponsive",
    "defined_in_session",
    "handle_sigterm_with",
    "session_refusal",
    "without_per_step_collectives",
]

# how a collective ends in the workers still running when a peer is gone (gloo's messages, lowercased;
# it adds "This is typically caused by a remote worker crashing" / "... hanging or bugs in the application")
PEER_LOST = ("connection closed by peer", "connection reset by peer", "caused by a remote worker")
# how a collective ends in a worker that waited longer than the strategy's timeout for a peer (gloo)
TIMED_OUT = ("timed out waiting",)


def without_per_step_collectives(trainer: L.Trainer) -> None:
    """Lightning (>= 2.5) broadcasts a SIGTERM flag from rank 0 before every training step. That is a
    per-step collective: workers taking different numbers of steps (uneven shards) would deadlock in
    it. Replace it, for this trainer's loop only, by the same check done locally."""
    loop = trainer.fit_loop.epoch_loop
    if not hasattr(loop, "_broadcast_sigterm_tensor"):
        return

    def local_sigterm_check() -> None:
        if getattr(trainer, "received_sigterm", False):
            raise SIGTERMException()

    loop._broadcast_sigterm_tensor = local_sigterm_check


def handle_sigterm_with(trainer: L.Trainer, handler: Any) -> None:
    """Lightning registers its SIGTERM handler (`_SignalConnector._sigterm_notifier_fn`) in every
    worker when fit starts, after the `setup` hooks. That handler broadcasts a flag from rank 0 from
    inside the signal handler: a collective that the other workers, which no longer broadcast it
    every step (above), never join, so a worker sent SIGTERM waited in it until the process group's
    timeout. Call from a `setup` hook: Lightning then registers `handler` in its place (and keeps
    composing it with a handler set before, as it does its own)."""
    connector = getattr(trainer, "_signal_connector", None)
    if connector is not None and hasattr(connector, "_sigterm_notifier_fn"):
        connector._sigterm_notifier_fn = handler


def _last_line_says(error: str, phrases: tuple[str, ...]) -> bool:
    """Whether the last line of a worker's error (its traceback text) holds one of `phrases`."""
    lines = error.strip().splitlines()
    return bool(lines) and any(s in lines[-1].lower() for s in phrases)


def lost_a_peer(error: str) -> bool:
    """Whether a worker's error only says another worker went away (gloo's connection loss)."""
    return _last_line_says(error, PEER_LOST)


def timed_out(error: str) -> bool:
    """Whether a worker's error is a collective that waited past its timeout."""
    return _last_line_says(error, TIMED_OUT)


class KilledWorker(ProcessExitedException):
    """A worker that died of SIGKILL, with why: its message is the run's verdict. Picklable from its
    constructor's arguments (a sweep launcher returns it from another process)."""

    def __init__(self, message: str, rank: int, pid: int, *args: Any):
        self._args = (rank, pid, *args)
        super().__init__(message, error_index=rank, error_pid=pid, exit_code=-signal.SIGKILL, signal_name="SIGKILL")

    def __reduce__(self):
        return type(self), self._args


class WorkerUnresponsive(KilledWorker):
    """A worker that stopped responding: a peer's collective timed out waiting for it, and it did not
    exit on torch's SIGTERM either (torch killed it 30 s later)."""

    def __init__(self, rank: int, pid: int, waiter: int, timeout_s: float | None):
        waited = f"{timeout_s:g} s, strategy.timeout_s" if timeout_s is not None else "strategy.timeout_s"
        message = (
            f"worker rank {rank} stopped responding: worker rank {waiter} waited for it in a collective ({waited}) "
            "and it did not exit on SIGTERM either (stopped, deadlocked or stuck in a system call)"
        )
        super().__init__(message, rank, pid, waiter, timeout_s)


class WorkerOutOfMemory(KilledWorker):
    """A worker the kernel's out-of-memory killer ended: it died of SIGKILL, and the kernel's count of
    OOM kills rose while the run's workers ran."""

    def __init__(self, rank: int, pid: int, kills: int):
        message = (
            f"worker rank {rank} was killed by the kernel's out-of-memory killer (SIGKILL; the kernel's OOM-kill "
            f"count rose by {kills} during the run): each worker is a process with its own torch, data and buffers; "
            "use fewer workers or a smaller data.batch_size"
        )
        super().__init__(message, rank, pid, kills)


class ForkServerDied(KilledWorker):
    """psgd's fork server, which started the workers and tells the launcher how each ended, died while
    they ran: their exit codes read 255 (multiprocessing's "cannot ask"). The launcher kills them."""

    def __init__(self, server: int, kills: int | None):
        why = (
            f"killed by the kernel's out-of-memory killer (its OOM-kill count rose by {kills} during the run): "
            "use fewer workers or a smaller data.batch_size"
            if kills
            else "killed by a signal"
        )
        message = f"psgd's fork server (pid {server}), which started the workers, died ({why}); they were stopped"
        super().__init__(message, 0, server)
        self._args = (server, kills)  # (pickled from these)


def refuse_a_run_while_a_worker_imports_the_script() -> None:
    """A script that trains at its top level (psgd.run.train, or a Trainer with psgd's strategies),
    outside `if __name__ == "__main__":`, would train again in every worker: Python's forkserver and
    spawn start a worker by importing the caller's script (as `__mp_main__`). Such a worker says so in
    one line and exits, before it starts anything (it used to fail deep in multiprocessing with a page
    of traceback per worker)."""
    frame = sys._getframe(1)
    while frame is not None and not (
        frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__mp_main__"
    ):
        frame = frame.f_back
    if frame is None:
        return
    say(  # (each worker says it, at the same moment)
        f"psgd: error: {frame.f_code.co_filename} runs psgd at its top level, and each worker process imports "
        'that script again as it starts: put the call under `if __name__ == "__main__":`'
    )
    raise SystemExit(2)


class _InSession(Exception):
    pass


class _Nowhere:
    """A file that keeps nothing written to it."""

    def write(self, data: bytes) -> int:
        return len(data)


class _SessionFinder(ForkingPickler):
    """Pickles as the launcher does, to find what refers to the session's `__main__`; tensors' data is
    skipped (nothing is written: see defined_in_session)."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor | np.ndarray):
            return tuple, ()  # its data is of no interest (and torch's reducer would move it to shared memory)
        if isinstance(obj, type | types.FunctionType) and getattr(obj, "__module__", None) == "__main__":
            raise _InSession(obj.__qualname__)
        return NotImplemented


def defined_in_session(*objects: Any) -> str | None:
    """The name of a class or function that `objects` refer to and that is defined in an interactive
    session's `__main__` (a notebook, Python's prompt, `python -c`), else None. Worker processes start
    without that session's code, so they cannot unpickle it: a worker failed with "Can't get
    attribute 'Net' on <module '__main__'>". A `__main__` that is a file is imported again by each
    worker as it starts, so a script's own classes reach them. Found by pickling the objects into
    nothing (what cannot be pickled for another reason is left to the launcher's pickling to report)."""
    main = sys.modules.get("__main__")
    if main is None or getattr(main, "__file__", None):
        return None
    try:
        _SessionFinder(_Nowhere(), pickle.HIGHEST_PROTOCOL).dump(objects)
    except _InSession as e:
        return str(e)
    except Exception:
        return None
    return None


def session_refusal(obj: Any, name: str, what: str | None = None) -> str:
    """The line for defined_in_session's finding `name` in `obj` (`what` names it; else its class)."""
    what = what or type(obj).__name__
    return (
        f"{what if name == type(obj).__qualname__ else f'{what} uses {name}, which'} is defined in this "
        "interactive session (a notebook or Python's prompt), and each worker process starts without the "
        "session's code: define it in a .py file beside the notebook and import it from there, or run one "
        "worker in this process"
    )


REPORT_KEY = "psgd_strategy_report"  # FirstFailureLauncher's extra result


class FirstFailureLauncher(_MultiProcessingLauncher):
    """Lightning's spawn/fork launcher, reporting the worker whose failure ended the run.

    torch reports the first worker process to exit with an error. When one worker fails alone (an
    error of its own, the OOM killer), its peers' next collective fails with gloo's "Connection closed
    by peer" as soon as its connections close, and one of them may exit first: the run then names the
    wrong worker and an error that says nothing. Each worker records its error here before its
    connections close (they close when it exits); if the reported error is a lost peer, the recorded
    error of a worker that failed on its own, or the signal that killed one, is raised in its place.
    If the reported error is a collective's timeout, a worker that recorded no error and had to be
    killed (it did not exit on SIGTERM) is the one that stopped responding: WorkerUnresponsive. A
    worker killed by SIGKILL while the kernel's OOM-kill count rose is WorkerOutOfMemory.

    With `forkserver` (psgd's default on CPU) each worker is forked from psgd's fork server
    (psgd.forkserver), already loaded, and takes what a spawned worker would have had: the launcher's
    environment and SIGINT handling, Lightning's global state (RNG states, deterministic flags), and
    a private copy of the model, as Lightning gives spawned CPU workers (torch hands tensors to a
    worker in shared memory: DDP workers would otherwise all step one set of weights).
    """

    _oom_kills_at_launch: int | None = None
    _private_models = True  # forkserver: each worker gets its own copy of the model, as with spawn
    _launcher_state: dict[str, Any] | None = None
    _global_states: _GlobalStateSnapshot | None = None

    @property
    def is_interactive_compatible(self) -> bool:
        """A notebook or Python's prompt may launch: workers start from a fresh interpreter or psgd's
        fork server, not from a fork of the session, and whatever of the session's own code they
        would need is refused first (defined_in_session; Lightning refuses spawn there for that)."""
        return True

    def launch(self, function, *args: Any, trainer=None, **kwargs: Any) -> Any:
        refuse_a_run_while_a_worker_imports_the_script()
        for obj in (*args, *kwargs.values(), *getattr(trainer, "callbacks", [])):  # model, data, callbacks
            name = defined_in_session(obj)
            if name:
                raise TypeError(session_refusal(obj, name))
        self._errors_dir = str(temp_folder_of_this_process("psgd-worker-errors-"))  # pickled into each worker
        self._oom_kills_at_launch = oom_kills()
        if self._start_method == "forkserver":  # (attributes set here are pickled into every worker)
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
    def get_extra_results(self, trainer: L.Trainer) -> dict[str, Any]:
        """Rank 0's results for the launching process, with the strategy's `report` (model averaging's
        replica distance, HogWild's updates per worker): Lightning sends back the weights, state and
        logged metrics only, so `trainer.strategy.report` was {} in the caller's process after fit."""
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
            server = forkserver.server_died()
            if server is not None:
                for proc in self.procs:  # orphaned, they would train on (and write) after the run failed
                    with contextlib.suppress(OSError):
                        os.kill(proc.pid, signal.SIGKILL)
                return ForkServerDied(server, oom_kills_since(self._oom_kills_at_launch))
        return self._out_of_memory(self._first_failure(e) if isinstance(e, ProcessRaisedException) else e)

    def _out_of_memory(self, cause: BaseException) -> BaseException:
        """`cause`, or WorkerOutOfMemory where it is a worker's SIGKILL and the OOM killer acted since launch."""
        if type(cause) is not ProcessExitedException or cause.exit_code != -signal.SIGKILL:
            return cause
        rose = oom_kills_since(self._oom_kills_at_launch)
        return WorkerOutOfMemory(cause.error_index, cause.error_pid, rose) if rose else cause

    def _wrapping_function(self, process_idx: int, *args: Any, **kwargs: Any) -> None:
        if self._launcher_state is not None:  # a fork-server child: what spawn would have given it
            forkserver.adopt_launcher_state(self._launcher_state)
            if self._private_models and args:
                trainer, function, fargs, fkwargs, return_queue = args[:5]
                fargs, fkwargs = _disable_module_memory_sharing((fargs, fkwargs))
                args = (trainer, function, fargs, fkwargs, return_queue, self._global_states)
        prepare_worker()  # the OOM killer's first pick, library noise filtered, quiet where the run is
        # before the rendezvous: a worker whose launcher died (the OOM killer, SIGKILL) while a peer it
        # waits for there died too would otherwise wait out strategy.timeout_s, orphaned
        die_with_parent()
        hang_up_as_sigterm()  # the terminal closed: the launcher stops the run as on SIGTERM, not as on a death
        ctrl_c_out_of_threading()  # (rank 0 closes the TensorBoard logger as Ctrl-C winds it down)
        try:
            super()._wrapping_function(process_idx, *args, **kwargs)
        except BaseException as e:
            if isinstance(e, Exception):  # its own error (Ctrl-C's KeyboardInterrupt is the user's)
                (Path(self._errors_dir) / f"{process_idx}").write_text(traceback.format_exc())
            let_go_of_the_process_group(args[0] if args else None)
            raise

    def _first_failure(self, e: ProcessRaisedException) -> BaseException:
        if timed_out(str(e)):
            return self._unresponsive(e) or e
        if not lost_a_peer(str(e)):
            return e
        for rank in range(len(self.procs)):
            path = Path(self._errors_dir) / str(rank)
            if rank != e.error_index and path.is_file():
                text = path.read_text()
                if not lost_a_peer(text):
                    header = f"\n\n-- Process {rank:d} terminated with the following error:\n"
                    return ProcessRaisedException(header + text, rank, self.procs[rank].pid)
        for rank, proc in enumerate(self.procs):  # killed: no error recorded (torch's own SIGTERM aside)
            code = proc.exitcode
            if code is not None and code < 0 and -code != signal.SIGTERM:
                name = signal.Signals(-code).name
                return ProcessExitedException(
                    f"process {rank:d} terminated with signal {name}",
                    error_index=rank,
                    error_pid=proc.pid,
                    exit_code=code,
                    signal_name=name,
                )
        return e

    def _unresponsive(self, e: ProcessRaisedException) -> WorkerUnresponsive | None:
        timeout = getattr(self._strategy, "_timeout", None)
        for rank, proc in enumerate(self.procs):
            recorded = (Path(self._errors_dir) / str(rank)).is_file()
            if rank != e.error_index and proc.exitcode == -signal.SIGKILL and not recorded:
                return WorkerUnresponsive(rank, proc.pid, e.error_index, timeout and timeout.total_seconds())
        return None


def destroy_process_group_at_exit() -> None:
    """Destroy this process's process group when Python exits, while the interpreter is still whole.

    Lightning does this for NCCL only. A gloo group left for interpreter finalization can abort the
    worker ("terminate called without an active exception", SIGABRT): a gloo thread that lets go of a
    collective's tensors needs the GIL, and once Python has begun to shut down, taking it ends the
    thread mid-destructor (seen in a core dump here; pytorch/pytorch#190489). Seen for rank 1 of 2-worker
    DDP runs that had finished training, and of a user's own 2-worker model-averaging script (spawn).
    The group is freed here only if nothing else holds it: a worker whose fit raised first has its
    strategy torn down (let_go_of_the_process_group). Registered once per process, by every psgd
    strategy as it sets its process group up (GroupEndsAtExit); a no-op if the group is gone by then."""
    global _exit_hook_registered
    if not _exit_hook_registered:
        atexit.register(_destroy_process_group)
        _exit_hook_registered = True


def _destroy_process_group() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


_exit_hook_registered = False


class GroupEndsAtExit:
    """Mixin for psgd's DDP-based strategies: the process group is destroyed at this process's exit
    (destroy_process_group_at_exit), in psgd's runs and in a user's own Lightning script alike."""

    def setup_distributed(self) -> None:
        super().setup_distributed()
        destroy_process_group_at_exit()  # (the hook itself does nothing where no group is left)


def let_go_of_the_process_group(trainer: L.Trainer | None) -> None:
    """In a worker whose fit raised or was interrupted (Ctrl-C): tear the strategy down as a finished fit
    does (the DDP wrapper, the last holder of the process group besides torch's registry, is unwrapped),
    so that the exit hook (destroy_process_group_at_exit) frees the group and joins gloo's
    threads while the interpreter is whole. Lightning tears down after an error only in the main
    process, and the trainer stays referenced until the worker process ends (garbage collection does
    not free it), so the group outlived Python's shutdown: a gloo thread still letting go of the last
    collective's tensors (decref needs the GIL) was then ended mid-destructor, "terminate called
    without an active exception" on stderr and SIGABRT (1 run in ~15 of Lightning's limit_train_batches
    refusal, whose check follows an all-reduce of each worker's batch count). A teardown that fails
    changes nothing: the worker's own error is what is reported."""
    if trainer is None:
        return
    try:
        trainer.strategy.teardown()
    except Exception:
        pass


class ReportsFirstFailure(TimesAllReduce, GroupEndsAtExit, DDPStrategy):
    """A DDPStrategy whose spawn/fork workers are started by FirstFailureLauncher (and which samples
    the DDP reducer's all-reduce timings, TimesAllReduce). Its steps hold no collective but the gradient
    all-reduce: SIGTERM is checked locally (without_per_step_collectives; +3 % samples/s for 2 CPU
    workers, measured), as in model averaging's and HogWild's."""

    @override
    def setup(self, trainer: L.Trainer) -> None:
        super().setup(trainer)
        without_per_step_collectives(trainer)

    def _configure_launcher(self) -> None:
        super()._configure_launcher()
        if type(self._launcher) is _MultiProcessingLauncher:
            self._launcher = FirstFailureLauncher(self, start_method=self._start_method)

    def on_exception(self, exception: BaseException) -> None:
        """DDP's error for parameters no loss used, in psgd's terms: the parameters by name and psgd's
        switch. (Lightning's own rewording drops torch's indices and names its Python-only strategy
        string.)"""
        unused = unused_parameters(exception, self.lightning_module)
        if unused is None:
            super().on_exception(exception)
            return
        # the last line, which psgd's error line shows, below torch's message (kept for the error log)
        exception.args = (
            f"{exception.args[0] if exception.args else ''}\nthe model has parameters that no loss used "
            f"({', '.join(unused) or 'see the traceback'}), and DDP needs a gradient for each: set "
            "strategy.find_unused_parameters=true (DDP then looks for them in every step), or leave them out of "
            "the model",
            *exception.args[1:],
        )


def unused_parameters(exception: BaseException, module: torch.nn.Module | None) -> list[str] | None:
    """The names of the parameters that torch's DDP reducer says received no gradient (its error
    gives indices into the module's trainable parameters), or None for another error. (A worker
    raises it; the launcher gets it as a ProcessRaisedException holding the worker's traceback.)"""
    text = str(exception)  # a worker's RuntimeError, or in the launcher the worker's traceback as text
    if "Expected to have finished reduction" not in text:
        return None
    found = re.search(r"did not receive grad for rank \d+: ([\d ]+)", text)
    if found is None or module is None:
        return []
    names = [name for name, p in module.named_parameters() if p.requires_grad]
    return [names[int(i)] for i in found.group(1).split() if int(i) < len(names)]


class SharedMemoryLauncher(FirstFailureLauncher):
    """Starts workers with `forkserver` so that module tensors stay shared.

    Lightning's launcher clones every module tensor in `spawn`ed CPU workers
    (`_disable_module_memory_sharing`) and its subprocess launcher re-executes the script: either
    would silently give each worker a private model. With `forkserver` the trainer is pickled by
    torch's reducers, which hand CPU storage over as shared memory, and nothing is cloned; unlike
    `fork`, each worker starts from a clean server process, not a copy of a parent whose OpenMP
    threads may be mid-flight.
    """

    _private_models = False

    def __init__(self, strategy: Any, prepare: Any):
        super().__init__(strategy, start_method="forkserver")
        self._prepare = prepare

    def launch(self, function, *args: Any, trainer=None, **kwargs: Any) -> Any:
        self._prepare()  # in the launching process, before any worker exists
        return super().launch(function, *args, trainer=trainer, **kwargs)


class PerWorkerCheckpoints:
    """Mixin for strategies whose workers hold different state: a checkpoint stores each worker's
    `per_worker_keys` under `replicas` (rank order), and resuming gives each worker its own. Each
    worker's lr schedule is its own too: with scheduler.interval=step it counts that worker's steps,
    and shards of different lengths give workers different steps per epoch."""

    per_worker_keys: tuple[str, ...] = ("optimizer_states", "lr_schedulers", STEPS_PER_EPOCH_KEY)
    # what the final (averaged) checkpoint gives every worker alike: the average and rank 0's optimizer
    shared_when_averaged = ("state_dict", "optimizer_states")
    _averaged = False
    _ended = False  # training has ended and `report` holds its end figures (save_final_checkpoint)

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath, storage_options: Any | None = None) -> None:
        mine = {k: checkpoint[k] for k in self.per_worker_keys if k in checkpoint}
        replicas: list[Any] = [None] * self.world_size
        dist.all_gather_object(replicas, mine)
        if self.is_global_zero:
            checkpoint = {**checkpoint, "replicas": replicas, "averaged": self._averaged}
            if self._ended and getattr(self, "report", None):  # the final checkpoint: the figures of its end
                checkpoint[REPORT_KEY] = dict(self.report)
            super().save_checkpoint(checkpoint, filepath, storage_options)

    def save_final_checkpoint(self) -> None:
        """In on_train_end, once `report` is made (every worker calls it): write the run's last checkpoint
        again, with the report, so that a resume with nothing left to train reports it again."""
        self._ended = True
        trainer = self.lightning_module.trainer
        checkpoint = trainer.checkpoint_callback
        path = checkpoint and (checkpoint.last_model_path or checkpoint.best_model_path)  # psgd's: last.ckpt
        if path:
            trainer.save_checkpoint(path, weights_only=False)  # full: can be continued

    def load_checkpoint(self, checkpoint_path, weights_only: bool | None = None) -> dict[str, Any]:
        """The checkpoint as this worker resumes from it: its own replica's keys in place of rank 0's.
        From the final (averaged) checkpoint every worker starts on the average, with its own schedule
        where the worker count is the same (any other count starts on rank 0's)."""
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        if REPORT_KEY in checkpoint:
            # a resume with nothing left to train reports the figures of the training that made these
            # weights (its metrics.json lacked them, and its val_acc was the replicas', not the average's);
            # one that trains on makes its own at its end (its checkpoints until then hold none: _ended)
            self.report = dict(checkpoint[REPORT_KEY])
        replicas = checkpoint.get("replicas")
        if not replicas:
            return checkpoint
        averaged = checkpoint.get("averaged")
        if len(replicas) != self.world_size:
            if averaged:
                return checkpoint
            raise RuntimeError(
                f"checkpoint holds {len(replicas)} workers' state but this run has {self.world_size} workers; "
                "resume with the same number of workers"
            )
        own = replicas[self.global_rank]
        # a key the replicas lack (a checkpoint written before it was kept per worker) stays rank 0's
        keys = [k for k in self.per_worker_keys if k in own and not (averaged and k in self.shared_when_averaged)]
        return {**checkpoint, **{k: own[k] for k in keys}}


def gather_floats(values: list[float], device: torch.device) -> list[list[float]]:
    """Every worker's `values`, in rank order, on every worker."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    out = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return [o.tolist() for o in out]
