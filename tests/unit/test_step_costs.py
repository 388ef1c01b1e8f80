"""psgd's per-worker settings: denormal flushing, the free profiler, Lightning's hook bookkeeping, the
process group's end."""

import subprocess
import sys

import pytest
import torch
from torch import nn

from psgd.callbacks import WorkerSetup, denormals_flushed
from psgd.module import Classifier
from psgd.profiler import NoProfiler


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


def test_classifier_keeps_lightnings_hook_name_out_of_its_state_but_registers_modules():
    module = Classifier(nn.Linear(3, 2), torch.optim.SGD, lr=0.1, num_classes=2)
    module._current_fx_name = "training_step"
    assert module._current_fx_name == "training_step"
    module.head = nn.Linear(2, 2)  # every other attribute still goes through nn.Module
    keys = set(module.state_dict())
    assert {"head.weight", "head.bias", "net.weight"} <= keys
    assert not any("fx_name" in k for k in keys)


def test_a_worker_leaves_no_process_group_to_interpreter_shutdown(tmp_path):
    """A gloo group torn down during interpreter finalization can abort the worker (SIGABRT); psgd's
    worker setup destroys it at exit, while Python is still whole."""
    script = f"""
import atexit, datetime, torch.distributed as dist
from psgd.callbacks import WorkerSetup
atexit.register(lambda: print("group alive at the end:", dist.is_initialized(), flush=True))  # runs last
store = dist.FileStore({str(tmp_path / "store")!r}, 1)
dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=30))
WorkerSetup(threads=1).setup(None, None, "fit")
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "group alive at the end: False" in proc.stdout
