"""Worker processes: how a failed one is told apart from its peers, what a worker cannot be given, the
end of their process group, and each worker's own part of a checkpoint."""

import atexit
import contextlib
import pickle
import re
import signal
import sys
import types
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as L
import torch
import torch.distributed as dist
from torch.multiprocessing import ProcessExitedException, ProcessRaisedException

from psgd.io import say
from psgd.module import STEPS_PER_EPOCH_KEY
from psgd.process import oom_kills_since

# how a collective ends in the workers still running when a peer is gone (gloo's messages, lowercased;
# it adds "This is typically caused by a remote worker crashing" / "... hanging or bugs in the application")
PEER_LOST = ("connection closed by peer", "connection reset by peer", "caused by a remote worker")
# how a collective ends in a worker that waited longer than the strategy's timeout for a peer (gloo)
TIMED_OUT = ("timed out waiting",)


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
        self._args = (server, kills)


def first_failure(e: ProcessRaisedException, procs: list, errors_dir: str, timeout_s: float | None) -> BaseException:
    """The failure that ended a run, where torch reported `e`, the first worker process to exit with an error.

    When one worker fails alone (an error of its own, the OOM killer), its peers' next collective fails
    with gloo's "Connection closed by peer", and one of them may exit first: `e` then names the wrong
    worker and an error that says nothing. Each worker records its error in `errors_dir` (a file named
    by its rank) before its connections close. Where `e` is a lost peer, a worker's recorded error of
    its own, or the signal that killed one, is returned instead. Where `e` is a collective's timeout, a
    worker that recorded no error and had to be killed (it did not exit on SIGTERM) is the one that
    stopped responding: WorkerUnresponsive. Otherwise `e` itself."""
    recorded = {rank: Path(errors_dir) / str(rank) for rank in range(len(procs))}
    if timed_out(str(e)):
        for rank, proc in enumerate(procs):
            if rank != e.error_index and proc.exitcode == -signal.SIGKILL and not recorded[rank].is_file():
                return WorkerUnresponsive(rank, proc.pid, e.error_index, timeout_s)
        return e
    if not lost_a_peer(str(e)):
        return e
    for rank, path in recorded.items():
        if rank != e.error_index and path.is_file():
            text = path.read_text()
            if not lost_a_peer(text):
                header = f"\n\n-- Process {rank:d} terminated with the following error:\n"
                return ProcessRaisedException(header + text, rank, procs[rank].pid)
    for rank, proc in enumerate(procs):  # killed: no error recorded (torch's own SIGTERM aside)
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


def out_of_memory(cause: BaseException, oom_kills_at_launch: int | None) -> BaseException:
    """`cause`, or WorkerOutOfMemory where it is a worker's SIGKILL and the kernel's OOM-kill count rose
    since the launch."""
    if type(cause) is not ProcessExitedException or cause.exit_code != -signal.SIGKILL:
        return cause
    rose = oom_kills_since(oom_kills_at_launch)
    return WorkerOutOfMemory(cause.error_index, cause.error_pid, rose) if rose else cause


def unused_parameters(exception: BaseException, module: torch.nn.Module | None) -> list[str] | None:
    """The names of the parameters that torch's DDP reducer says received no gradient (its error gives
    indices into the module's trainable parameters), or None for another error. `exception` is a worker's
    RuntimeError, or in the launcher a ProcessRaisedException holding the worker's traceback."""
    text = str(exception)
    if "Expected to have finished reduction" not in text:
        return None
    found = re.search(r"did not receive grad for rank \d+: ([\d ]+)", text)
    if found is None or module is None:
        return []
    names = [name for name, p in module.named_parameters() if p.requires_grad]
    return [names[int(i)] for i in found.group(1).split() if int(i) < len(names)]


def refuse_a_run_while_a_worker_imports_the_script() -> None:
    """Exit with one line (status 2) in a worker that is importing the caller's script.

    Python's forkserver and spawn start a worker by importing the caller's script as `__mp_main__`: a
    script that trains at its top level, outside `if __name__ == "__main__":`, would train again in
    every worker."""
    frame = sys._getframe(1)
    while frame is not None and not (
        frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__mp_main__"
    ):
        frame = frame.f_back
    if frame is None:
        return
    say(
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
    """Pickles as the launcher does, raising _InSession at the first class or function of `__main__`;
    tensors' data is skipped."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor | np.ndarray):
            return tuple, ()  # (torch's own reducer would move the tensor to shared memory)
        if isinstance(obj, type | types.FunctionType) and getattr(obj, "__module__", None) == "__main__":
            raise _InSession(obj.__qualname__)
        return NotImplemented


def defined_in_session(*objects: Any) -> str | None:
    """The name of a class or function that `objects` refer to and that is defined in an interactive
    session's `__main__` (a notebook, Python's prompt, `python -c`), else None.

    Worker processes start without that session's code, so they cannot unpickle it. A `__main__` that
    is a file is imported again by each worker, so a script's own classes reach them. Found by pickling
    the objects into nothing; what cannot be pickled for another reason is left to the launcher."""
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


_exit_hook_registered = False


def destroy_process_group_at_exit() -> None:
    """Destroy this process's process group when Python exits, while the interpreter is still whole.

    Lightning does this for NCCL only. A gloo group left for interpreter finalization can abort the
    worker ("terminate called without an active exception", SIGABRT): a gloo thread that lets go of a
    collective's tensors needs the GIL, which a finalizing interpreter no longer gives
    (pytorch/pytorch#190489). Registered once per process; a no-op if the group is gone by then."""
    global _exit_hook_registered
    if not _exit_hook_registered:
        atexit.register(_destroy_process_group)
        _exit_hook_registered = True


def _destroy_process_group() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


class GroupEndsAtExit:
    """DDPStrategy mixin: the process group is destroyed at this process's exit
    (destroy_process_group_at_exit), in psgd's runs and in a user's own Lightning script alike."""

    def setup_distributed(self) -> None:
        super().setup_distributed()
        destroy_process_group_at_exit()


def let_go_of_the_process_group(trainer: L.Trainer | None) -> None:
    """In a worker whose fit raised or was interrupted: tear the strategy down as a finished fit does.

    Lightning tears down after an error only in the main process; in a worker the DDP wrapper would keep
    the process group alive past the exit hook (destroy_process_group_at_exit) into interpreter
    finalization. A teardown that fails changes nothing: the worker's own error is what is reported."""
    if trainer is not None:
        with contextlib.suppress(Exception):
            trainer.strategy.teardown()


def gather_floats(values: list[float], device: torch.device) -> list[list[float]]:
    """Every worker's `values`, in rank order, on every worker."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    out = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return [o.tolist() for o in out]


REPORT_KEY = "psgd_strategy_report"  # the final checkpoint's copy of the strategy's figures (`report`)


class PerWorkerCheckpoints:
    """Strategy mixin for workers that hold different state.

    A checkpoint stores each worker's `per_worker_keys` under `replicas` (rank order), and a resume gives
    each worker its own. Each worker's lr schedule is its own too: with scheduler.interval=step it counts
    that worker's steps, and shards of different lengths give workers different steps per epoch."""

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
            if self._ended and getattr(self, "report", None):
                checkpoint[REPORT_KEY] = dict(self.report)
            super().save_checkpoint(checkpoint, filepath, storage_options)

    def save_final_checkpoint(self) -> None:
        """In on_train_end, once `report` is made (every worker calls it): write the run's last checkpoint
        again, with the report, so that a resume with nothing left to train reports it again."""
        self._ended = True
        trainer = self.lightning_module.trainer
        checkpoint = trainer.checkpoint_callback
        path = checkpoint and (checkpoint.last_model_path or checkpoint.best_model_path)
        if path:
            trainer.save_checkpoint(path, weights_only=False)  # full: can be continued

    def load_checkpoint(self, checkpoint_path, weights_only: bool | None = None) -> dict[str, Any]:
        """The checkpoint as this worker resumes from it: its own replica's keys in place of rank 0's.
        From the final (averaged) checkpoint every worker starts on the average, with its own schedule
        where the worker count is the same (any other count starts on rank 0's)."""
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        if REPORT_KEY in checkpoint:
            # a resume with nothing left to train reports the figures of the training that made these weights
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
        # a key the replicas lack stays rank 0's
        keys = [k for k in self.per_worker_keys if k in own and not (averaged and k in self.shared_when_averaged)]
        return {**checkpoint, **{k: own[k] for k in keys}}
