"""Which worker a failed multi-process run names (psgd.strategies.lightning_internals.FirstFailureLauncher),
decided over real processes that ended the ways workers end. The whole runs are in
tests/reliability/test_failures.py (a killed, SIGTERMed, failing-alone and stopped worker)."""

import errno
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import time
import traceback
from datetime import timedelta

import pytest
import pytorch_lightning as L
import torch
import torch.distributed as dist
from conftest import own_lines
from torch import nn
from torch.multiprocessing import ProcessExitedException, ProcessRaisedException
from torch.nn.parallel import DistributedDataParallel

from psgd import process
from psgd.cli import error_line, keeps_traceback, traceback_path
from psgd.errors import KilledWorker
from psgd.strategies.ddp import ReportsFirstFailure
from psgd.strategies.lightning_internals import FirstFailureLauncher

TIMED_OUT = (
    "RuntimeError: [../gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 7000ms for recv operation to complete"
)
LOST_PEER = "RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:41234"


def ended(how: str) -> multiprocessing.Process:
    """A real process that ended as a worker can: `failed` (exit code 1, as a worker that raised),
    `terminated` (it exited on SIGTERM), `killed` (SIGKILL: torch's last resort, or the OOM killer)."""
    proc = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,))
    proc.start()
    if how == "failed":
        proc.kill()
        proc.join()
        proc = multiprocessing.get_context("fork").Process(target=sys.exit, args=(1,))
        proc.start()
    else:
        os.kill(proc.pid, signal.SIGTERM if how == "terminated" else signal.SIGKILL)
    proc.join()
    return proc


def launcher(tmp_path, *endings: str, recorded: dict[int, str]) -> FirstFailureLauncher:
    """A launcher as it is after its workers ended: their processes, and the errors they recorded."""
    fl = FirstFailureLauncher(ReportsFirstFailure(timeout=timedelta(seconds=7)), start_method="spawn")
    fl.procs = [ended(how) for how in endings]
    fl._errors_dir = str(tmp_path)
    for rank, text in recorded.items():
        (tmp_path / str(rank)).write_text(f"Traceback (most recent call last):\n  ...\n{text}\n")
    return fl


def raised(rank: int, last_line: str, pid: int = 0) -> ProcessRaisedException:
    return ProcessRaisedException(
        f"\n\n-- Process {rank} terminated with the following error:\nTraceback:\n  ...\n{last_line}\n", rank, pid
    )


def test_an_errors_line_is_the_first_of_its_message_here_and_the_named_one_from_a_worker(tmp_path):
    """OmegaConf's messages end in "full_key: ..." and "object_type=dict": the line is the first one, which
    names the key, not that last one ("ConfigAttributeError: object_type=dict")."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"trainer": {}})
    OmegaConf.set_struct(cfg, True)
    with pytest.raises(Exception) as here:
        _ = cfg.trainer.max_epochs
    assert error_line(here.value, tmp_path) == (
        f"ConfigAttributeError: Key 'max_epochs' is not in struct (traceback in {tmp_path / 'error.log'})"
    )
    text = "".join(traceback.format_exception(here.value))  # the same, raised in worker 1
    assert error_line(
        ProcessRaisedException(f"\n\n-- Process 1 terminated with the following error:\n{text}", 1, 0), tmp_path
    ) == (
        "worker rank 1 failed: omegaconf.errors.ConfigAttributeError: Key 'max_epochs' is not in struct "
        f"(traceback in {tmp_path / 'error.log'})"
    )


def test_a_peer_that_timed_out_waiting_names_the_worker_that_stopped_responding(tmp_path):
    fl = launcher(tmp_path, "failed", "killed", recorded={0: TIMED_OUT})
    verdict = fl._explain(raised(0, TIMED_OUT))
    assert isinstance(verdict, KilledWorker) and verdict.error_index == 1
    assert verdict.error_pid == fl.procs[1].pid
    assert str(pickle.loads(pickle.dumps(verdict))) == str(verdict)  # as a sweep launcher returns it
    assert error_line(verdict, tmp_path / "run") == (
        "worker rank 1 stopped responding: worker rank 0 waited for it in a collective (7 s, strategy.timeout_s) "
        f"and it did not exit on SIGTERM either (stopped, deadlocked or stuck in a system call); results of "
        f"finished epochs are in {tmp_path / 'run'}"
    )


@pytest.mark.parametrize(
    "other,recorded",
    [
        ("terminated", {}),  # it exited on SIGTERM: it was responding, maybe only slower
        ("killed", {1: "ValueError: its own error"}),  # it failed on its own, and was killed while reporting
    ],
    ids=["it-exited-on-sigterm", "it-recorded-an-error"],
)
def test_a_timeout_with_no_unresponsive_worker_stays_the_peers_error_and_says_what_timed_out(tmp_path, other, recorded):
    fl = launcher(tmp_path, "failed", other, recorded={0: TIMED_OUT, **recorded})
    e = raised(0, TIMED_OUT)
    assert fl._explain(e) is e
    assert error_line(e, tmp_path) == f"worker rank 0 failed: {TIMED_OUT} (traceback in {tmp_path / 'error.log'})"


def test_a_lost_peer_still_names_the_worker_that_was_killed(tmp_path):
    """The OOM killer's case: the survivor's gloo connection closes at once (no timeout)."""
    fl = launcher(tmp_path, "failed", "killed", recorded={0: LOST_PEER})
    verdict = fl._explain(raised(0, LOST_PEER))
    assert type(verdict) is ProcessExitedException and verdict.error_index == 1
    assert error_line(verdict, tmp_path).startswith("worker rank 1 died (signal SIGKILL)")


def test_a_lost_peer_seen_through_the_comm_hooks_futures_is_still_a_lost_peer(tmp_path):
    """psgd times DDP's all-reduce in a torch future's callback: torch reports an error raised there with a
    prefix and the callback's frames after it, which hid gloo's lost connection from the last line."""
    fut = torch.futures.Future()
    chained = fut.then(lambda f: f.value()).then(lambda f: f.value())  # torch's allreduce_hook, then psgd's
    fut.set_exception(RuntimeError(LOST_PEER.removeprefix("RuntimeError: ")))
    with pytest.raises(RuntimeError) as caught:
        chained.wait()
    text = "".join(traceback.format_exception(caught.value))
    assert "At:" in text and text.strip().splitlines()[-1] != LOST_PEER  # what torch raises
    fl = launcher(tmp_path, "failed", "killed", recorded={0: text})
    verdict = fl._explain(raised(0, text))
    assert type(verdict) is ProcessExitedException and verdict.error_index == 1
    assert error_line(raised(1, text), tmp_path).startswith(f"worker rank 1 failed: {LOST_PEER} (traceback")


def oom_kills_now(tmp_path, monkeypatch, count: int | None) -> None:
    """The kernel's OOM-kill count as /proc/vmstat gives it (None: a kernel that does not count them)."""
    vmstat = tmp_path / "vmstat"
    vmstat.write_text("nr_free_pages 1000\n" + (f"oom_kill {count}\n" if count is not None else "") + "numa_hit 5\n")
    monkeypatch.setattr(process, "VMSTAT", str(vmstat))


def killed(rank: int, pid: int) -> ProcessExitedException:
    """torch's report of a worker that died of SIGKILL, as it raises it when that worker ended first."""
    return ProcessExitedException(
        f"process {rank} terminated with signal SIGKILL", error_index=rank, error_pid=pid, exit_code=-9,
        signal_name="SIGKILL",
    )  # fmt: skip


@pytest.mark.parametrize("first", ["killed-first", "peer-lost-first"])
def test_a_worker_killed_while_the_kernels_oom_count_rose_is_named_as_out_of_memory(tmp_path, monkeypatch, first):
    fl = launcher(tmp_path, "failed", "killed", recorded={0: LOST_PEER})
    oom_kills_now(tmp_path, monkeypatch, 41)
    fl._oom_kills_at_launch = process.oom_kills()
    oom_kills_now(tmp_path, monkeypatch, 42)  # the OOM killer acted during the run
    e = killed(1, fl.procs[1].pid) if first == "killed-first" else raised(0, LOST_PEER)
    verdict = fl._explain(e)
    assert isinstance(verdict, KilledWorker) and (verdict.error_index, verdict.error_pid) == (1, fl.procs[1].pid)
    assert str(pickle.loads(pickle.dumps(verdict))) == str(verdict)  # as a sweep launcher returns it
    assert error_line(verdict, tmp_path / "run") == (
        "worker rank 1 was killed by the kernel's out-of-memory killer (SIGKILL; the kernel's OOM-kill count rose "
        "by 1 during the run): each worker is a process with its own torch, data and buffers; use fewer workers "
        f"or a smaller data.batch_size; results of finished epochs are in {tmp_path / 'run'}"
    )


@pytest.mark.parametrize(
    "before,after", [(42, 42), (None, None), (42, None)], ids=["no-oom-kill", "not-counted", "unreadable"]
)
def test_a_killed_worker_is_only_called_out_of_memory_when_the_kernel_counted_an_oom_kill(
    tmp_path, monkeypatch, before, after
):
    fl = launcher(tmp_path, "failed", "killed", recorded={})
    oom_kills_now(tmp_path, monkeypatch, before)
    fl._oom_kills_at_launch = process.oom_kills()
    oom_kills_now(tmp_path, monkeypatch, after)
    e = killed(1, fl.procs[1].pid)
    assert fl._explain(e) is e
    assert error_line(e, tmp_path).startswith("worker rank 1 died (signal SIGKILL)")


def test_oom_kills_reads_this_kernels_count():
    if not os.path.exists("/proc/vmstat"):
        pytest.skip("no /proc/vmstat")
    with open("/proc/vmstat") as f:
        counted = any(line.startswith("oom_kill ") for line in f)
    assert (process.oom_kills() is not None) == counted
    if counted:
        assert process.oom_kills() >= 0


@pytest.mark.parametrize(
    "message",
    [TIMED_OUT.removeprefix("RuntimeError: "), LOST_PEER.removeprefix("RuntimeError: ")],
    ids=["timed-out", "lost-peer"],
)
def test_a_torchrun_workers_collective_failure_is_its_one_line_naming_its_rank(tmp_path, monkeypatch, message):
    """Under torchrun each worker is a train.py process: its gloo error is psgd's one line, not Hydra's report
    ("Error executing job with overrides: [...]", the error, "Set the environment variable HYDRA_FULL_ERROR=1")."""
    monkeypatch.setenv("RANK", "3")
    assert error_line(RuntimeError(message), tmp_path) == (
        f"worker rank 3 failed: RuntimeError: {message} (traceback in {tmp_path / 'error.rank3.log'})"
    )


def test_prefer_as_oom_victim_raises_but_never_lowers(tmp_path):
    adj = tmp_path / "oom_score_adj"
    adj.write_text("100\n")
    process.prefer_as_oom_victim(500, str(adj))
    assert adj.read_text() == "500"
    adj.write_text("800\n")  # set higher already (by the user, or a container): kept
    process.prefer_as_oom_victim(500, str(adj))
    assert adj.read_text() == "800\n"
    process.prefer_as_oom_victim(500, str(tmp_path / "missing"))  # no such file: nothing to do, no error


def test_a_workers_own_error_names_the_log_with_its_traceback_and_psgds_errors_or_a_lost_peer_do_not(tmp_path):
    """A worker's error that is not psgd's (a bug in the user's model) is 'worker rank r failed: <its
    last line> (traceback in <run dir>/error.log)', and keeps_traceback says to write that log; a worker's
    DataError or a dead worker say all there is in their line."""
    bug = raised(1, "ValueError: a bug deep in my model")
    assert error_line(bug, tmp_path) == (
        f"worker rank 1 failed: ValueError: a bug deep in my model (traceback in {tmp_path / 'error.log'})"
    )
    assert keeps_traceback(bug) and keeps_traceback(ValueError("in this process"))
    data = raised(0, "psgd.errors.DataError: dataset mnist not found or unreadable under /x (...)")
    for e in (data, ProcessExitedException("", 1, 0, 9, "SIGKILL")):
        assert not keeps_traceback(e) and "traceback in" not in error_line(e, tmp_path), e


def test_a_disk_without_room_is_one_line_naming_the_file_in_this_process_or_a_worker(tmp_path):
    """A write that failed for want of room (ENOSPC, a quota) says which file and why, in one line without
    a traceback to keep (none would fit); a worker's says it the same way."""
    full = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "checkpoints" / "last.ckpt"))
    worker = raised(0, f"OSError: [Errno {errno.EDQUOT}] Disk quota exceeded: '{tmp_path / 'metrics.json'}'")
    for e, line in (
        (full, f"cannot write {full.filename}: No space left on device"),
        (worker, f"cannot write {tmp_path / 'metrics.json'}: Disk quota exceeded"),
    ):
        assert error_line(e, tmp_path) == line
        assert not keeps_traceback(e)
    assert keeps_traceback(OSError(errno.ENOENT, "No such file or directory", "mine.txt"))  # a bug's, maybe


def test_under_torchrun_each_worker_keeps_its_own_traceback(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    assert error_line(ValueError("a bug"), tmp_path) == (
        f"worker rank 3 failed: ValueError: a bug (traceback in {tmp_path / 'error.rank3.log'})"
    )
    monkeypatch.setenv("RANK", "0")
    assert traceback_path(tmp_path) == tmp_path / "error.log"  # rank 0's is the run's error.log


class _WithAnUnusedLayer(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.used, self.spare = nn.Linear(4, 2), nn.Linear(2, 2)

    def forward(self, x):
        return self.used(x)


def test_ddps_error_for_parameters_no_loss_used_names_psgds_switch(tmp_path):
    """torch's DDP error names DDP's own argument, and its last line (the one a user sees) an environment
    variable: a worker's line names strategy.find_unused_parameters, in the worker (torchrun) and in psgd's
    launcher."""
    module = _WithAnUnusedLayer()
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        ddp = DistributedDataParallel(module)
        with pytest.raises(RuntimeError) as caught:
            for _ in range(2):  # the second step finds the first one's reduction unfinished
                ddp(torch.randn(3, 4)).sum().backward()
    finally:
        dist.destroy_process_group()
    err = caught.value
    from_worker = ProcessRaisedException(
        f"\n\n-- Process 1 terminated with the following error:\n{''.join(traceback.format_exception(err))}", 1, 0
    )
    strategy = ReportsFirstFailure()
    strategy.connect(module)
    fix = (
        "the model has parameters that no loss used, and DDP needs a gradient for each: "
        "set strategy.find_unused_parameters=true (DDP then looks for them in every step), or leave them out of "
        "the model"
    )
    strategy.on_exception(from_worker)  # psgd's launcher
    assert error_line(from_worker, tmp_path) == f"worker rank 1 failed: {fix} (traceback in {tmp_path / 'error.log'})"
    assert "Parameter indices which did not receive grad" in str(from_worker)  # torch's text stays for the log
    strategy.on_exception(err)  # a worker torchrun started
    assert error_line(err, tmp_path) == f"RuntimeError: {fix} (traceback in {tmp_path / 'error.log'})"
    other = ValueError("a bug deep in my model")
    strategy.on_exception(other)
    assert str(other) == "a bug deep in my model"


def test_a_validation_interval_longer_than_an_epoch_is_lightnings_refusal_here_and_from_a_worker(tmp_path):
    """Lightning finds an integer trainer.val_check_interval above an epoch's batches only inside fit and
    raises a ValueError: it is reported as a setting Lightning refuses, as its MisconfigurationExceptions
    are, not as a bug ('worker rank 0 failed: ValueError: ... (traceback in ...)')."""
    from torch.utils.data import DataLoader, TensorDataset

    from psgd.stopped import lightning_refusal

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(4, 2)

        def training_step(self, batch, batch_idx):
            return nn.functional.cross_entropy(self.net(batch[0]), batch[1])

        def validation_step(self, batch, batch_idx):
            pass

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = DataLoader(TensorDataset(torch.randn(8, 4), torch.randint(0, 2, (8,))), batch_size=4)  # 2 batches
    trainer = L.Trainer(
        max_epochs=1, val_check_interval=3, logger=False, enable_checkpointing=False, enable_progress_bar=False
    )
    with pytest.raises(ValueError) as caught:
        trainer.fit(Tiny(), data, data)
    said = lightning_refusal(caught.value)
    assert said is not None and said.startswith("`val_check_interval` (3) must be less than or equal to the number")
    from_worker = ProcessRaisedException(
        f"\n\n-- Process 0 terminated with the following error:\n{''.join(traceback.format_exception(caught.value))}",
        0,
        0,
    )
    assert lightning_refusal(from_worker) == said
    assert lightning_refusal(ValueError("a bug deep in my model")) is None
    assert lightning_refusal(raised(1, "ValueError: a bug deep in my model")) is None


def test_a_worker_leaves_no_process_group_to_interpreter_shutdown():
    """A gloo group torn down during interpreter finalization can abort the worker (SIGABRT); each of
    psgd's strategies destroys it at exit, while Python is still whole, in psgd's runs and in a user's
    own Lightning script alike (a user's model-averaging script aborted rank 1 so: it has no WorkerSetup,
    which had registered the exit hook). One process: each strategy in turn must register the hook."""
    script = """
import atexit, torch, torch.distributed as dist
from lightning_fabric.plugins.environments import LightningEnvironment
from pytorch_lightning.accelerators import CPUAccelerator
from psgd.strategies.hogwild import HogwildStrategy
from psgd.strategies.model_averaging import ModelAveragingStrategy
from psgd.strategies import ddp, workers
atexit.register(lambda: print("group alive at the end:", dist.is_initialized(), flush=True))  # runs last
for cls in (ddp.ReportsFirstFailure, ModelAveragingStrategy, HogwildStrategy):  # psgd's DDP, and the others
    atexit.unregister(workers._destroy_process_group)  # as in a process of its own
    hooks = atexit._ncallbacks()
    strategy = cls(accelerator=CPUAccelerator(), parallel_devices=[torch.device("cpu")],
        cluster_environment=LightningEnvironment(), process_group_backend="gloo")
    strategy.setup_distributed()  # (the group is made once; the hook is registered by each)
    print(cls.__name__, "group alive:", dist.is_initialized(), "exit hook:", atexit._ncallbacks() == hooks + 1)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert own_lines(proc.stdout) == [
        "ReportsFirstFailure group alive: True exit hook: True",
        "ModelAveragingStrategy group alive: True exit hook: True",
        "HogwildStrategy group alive: True exit hook: True",
        "group alive at the end: False",
    ], proc.stdout + proc.stderr[-2000:]
