"""Worker processes: how a failed one is told apart from its peers, what a worker cannot be given, the
end of their process group, and each worker's own part of a checkpoint."""

import atexit
import signal
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.multiprocessing import ProcessExitedException, ProcessRaisedException

from psgd.console import text_lines
from psgd.errors import KilledWorker
from psgd.process import oom_kills_since

# how a collective ends in the workers still running when a peer is gone (gloo's messages, lowercased)
PEER_LOST = ("connection closed by peer", "connection reset by peer", "caused by a remote worker")
# how a collective ends in a worker that waited longer than the strategy's timeout for a peer (gloo)
TIMED_OUT = ("timed out waiting",)


def _last_line_says(error: str, phrases: tuple[str, ...]) -> bool:
    """Whether the last line of a worker's error (its traceback text) holds one of `phrases`."""
    return any(s in text_lines(error)[-1].lower() for s in phrases)


def lost_a_peer(error: str) -> bool:
    """Whether a worker's error only says another worker went away (gloo's connection loss)."""
    return _last_line_says(error, PEER_LOST)


def first_failure(e: ProcessRaisedException, procs: list, errors_dir: str, timeout_s: float | None) -> BaseException:
    """The failure that ended a run where torch reported `e`, the first worker to exit with an error.

    A worker that fails alone makes its peers' next collective fail with "connection closed by peer", and
    one of them may exit first. So where `e` is a lost peer, the error another worker recorded in
    `errors_dir` (a file per rank), or the signal that killed one, is returned instead; where `e` is a
    collective's timeout, a worker that recorded nothing and had to be killed is named as unresponsive."""
    recorded = {rank: Path(errors_dir) / str(rank) for rank in range(len(procs))}
    if _last_line_says(str(e), TIMED_OUT):
        waited = f"{timeout_s:g} s, strategy.timeout_s" if timeout_s is not None else "strategy.timeout_s"
        for rank, proc in enumerate(procs):
            if rank != e.error_index and proc.exitcode == -signal.SIGKILL and not recorded[rank].is_file():
                return KilledWorker(
                    f"worker rank {rank} stopped responding: worker rank {e.error_index} waited for it in a "
                    f"collective ({waited}) and it did not exit on SIGTERM either (stopped, deadlocked or stuck in "
                    "a system call)",
                    rank,
                    proc.pid,
                )
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
    """`cause`, or its worker named as the OOM killer's where it is a SIGKILL and the OOM-kill count rose
    since the launch."""
    if type(cause) is not ProcessExitedException or cause.exit_code != -signal.SIGKILL:
        return cause
    rose = oom_kills_since(oom_kills_at_launch)
    if not rose:
        return cause
    return KilledWorker(
        f"worker rank {cause.error_index} was killed by the kernel's out-of-memory killer (SIGKILL; the kernel's "
        f"OOM-kill count rose by {rose} during the run): each worker is a process with its own torch, data and "
        "buffers; use fewer workers or a smaller data.batch_size",
        cause.error_index,
        cause.error_pid,
    )


def session_refusal(obj: Any) -> str | None:
    """The line refusing `obj` where its class is defined in an interactive session's `__main__` (a notebook,
    Python's prompt): worker processes start without the session's code."""
    main = sys.modules.get("__main__")
    if type(obj).__module__ != "__main__" or main is None or getattr(main, "__file__", None):
        return None
    return (
        f"{type(obj).__name__} is defined in this interactive session (a notebook or Python's prompt), and "
        "each worker process starts without the session's code: define it in a .py file beside the notebook and "
        "import it from there, or run one worker in this process"
    )


def _destroy_process_group() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


class GroupEndsAtExit:
    """DDPStrategy mixin: the process group is destroyed when this process exits, while the interpreter is
    still whole: a gloo group left for finalization can abort the worker (pytorch/pytorch#190489)."""

    def setup_distributed(self) -> None:
        super().setup_distributed()
        atexit.unregister(_destroy_process_group)  # registered once
        atexit.register(_destroy_process_group)


def over_workers(values: list[float], device: torch.device, op: dist.ReduceOp = dist.ReduceOp.SUM) -> list[float]:
    """Every worker's `values` reduced by `op` (the sum, the max), on every worker."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t, op=op)
    return t.tolist()


def gather_floats(values: list[float], device: torch.device) -> list[list[float]]:
    """Every worker's `values`, in rank order, on every worker (this process's alone without a process group)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if not (dist.is_available() and dist.is_initialized()):
        return [t.tolist()]
    out = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return [o.tolist() for o in out]


REPORT_KEY = "psgd_strategy_report"  # the final checkpoint's copy of the strategy's figures (`report`)


class PerWorkerCheckpoints:
    """Strategy mixin for workers that hold different state: a checkpoint stores each worker's
    `per_worker_keys` under `replicas`, and a resume gives each worker its own."""

    per_worker_keys: tuple[str, ...] = ("optimizer_states", "lr_schedulers")
    # what the final (averaged) checkpoint gives every worker alike
    shared_when_averaged = ("state_dict", "optimizer_states")
    _averaged = False
    _ended = False  # `report` holds the end figures

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath, storage_options: Any | None = None) -> None:
        mine = {k: checkpoint[k] for k in self.per_worker_keys if k in checkpoint}
        replicas = self.comm.gather_objects(mine)
        if self.is_global_zero:
            checkpoint = {**checkpoint, "replicas": replicas, "averaged": self._averaged}
            if self._ended and getattr(self, "report", None):
                checkpoint[REPORT_KEY] = dict(self.report)
            super().save_checkpoint(checkpoint, filepath, storage_options)

    def save_final_checkpoint(self) -> None:
        """Write the last checkpoint again with `report` (every worker calls it in on_train_end)."""
        self._ended = True
        trainer = self.lightning_module.trainer
        checkpoint = trainer.checkpoint_callback
        path = checkpoint and (checkpoint.last_model_path or checkpoint.best_model_path)
        if path:
            trainer.save_checkpoint(path, weights_only=False)  # full: can be continued

    def load_checkpoint(self, checkpoint_path, weights_only: bool | None = None) -> dict[str, Any]:
        """The checkpoint with this worker's own replica's keys; from the final (averaged) one every worker
        starts on the average, also with another worker count (psgd.resume refuses one for the others)."""
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        if REPORT_KEY in checkpoint:
            self.report = dict(checkpoint[REPORT_KEY])
        replicas, averaged = checkpoint.get("replicas"), checkpoint.get("averaged")
        if not replicas or (averaged and len(replicas) != self.world_size):
            return checkpoint
        own = replicas[self.global_rank]
        keys = [k for k in self.per_worker_keys if k in own and not (averaged and k in self.shared_when_averaged)]
        return {**checkpoint, **{k: own[k] for k in keys}}
