"""A run that cannot fit in memory is refused before any worker starts, from a count that is a lower bound."""

import pytest
import torch
from torch import nn

from psgd.memory import (
    WORKER_PROCESS_BYTES,
    activation_bytes_per_sample,
    available_bytes,
    memory_problem,
    saved_bytes,
    state_bytes,
)
from psgd.models import LabCNN


class Reuses(nn.Module):
    """A ReLU's output that the next layer keeps too, through a view: counted once."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(12, 32), nn.Linear(32, 4)

    def forward(self, x):
        h = torch.relu(self.a(x.flatten(1)))
        return self.b(h.view(len(x), 32)) + h.sum(1, keepdim=True)


class ReadsAValue(nn.Module):
    """Runs on the CPU, not on the meta device (.item())."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(12, 4)

    def forward(self, x):
        return self.fc(x.flatten(1)) * float(x.abs().max().item() > 0)


@pytest.mark.parametrize("net,shape", [(LabCNN(), (1, 28, 28)), (Reuses(), (3, 2, 2))], ids=["lab CNN", "reused"])
def test_the_count_per_sample_is_what_a_real_forward_keeps_for_backward(net, shape):
    """The meta count equals what a CPU forward keeps (each storage once) for each added sample."""
    per_sample = activation_bytes_per_sample(net, shape)
    net.train()
    kept = {n: saved_bytes(net, torch.randn(n, *shape)) for n in (2, 10)}
    assert per_sample > 0 and kept[10] - kept[2] == 8 * per_sample
    if isinstance(net, Reuses):  # the flattened input (12 floats) and the ReLU's output (32), once each
        assert per_sample == (12 + 32) * 4


def test_a_run_is_refused_only_where_even_the_lower_bound_does_not_fit():
    net, shape = LabCNN(), (1, 28, 28)
    per_sample, fixed = activation_bytes_per_sample(net, shape), state_bytes(net, "SGD")
    weights = sum(p.numel() for p in net.parameters()) * 4
    assert fixed == 3 * weights and state_bytes(net, "Adam") == 4 * weights  # + gradients + momentum / moments
    # 2 workers of a batch of 100 fit exactly, each a process of its own
    available = 2 * (100 * per_sample + fixed + WORKER_PROCESS_BYTES)
    assert memory_problem(net, shape, 100, 2, "SGD", "data.batch_size=100", available=available) is None
    line = memory_problem(net, shape, 101, 2, "SGD", "data.batch_size=101", available=available)
    assert line.startswith("data.batch_size=101 needs at least ") and "x 101 x 2 workers" in line
    assert "optimizer state, and 100 MiB per worker process), more than" in line
    assert "lower data.batch_size (at most 100 fits with these workers) or the workers" in line
    # many workers: their processes alone exceed the memory, whatever the batch (each held 134-352 MB
    # here; the run would have been killed by the kernel once they had started)
    many = memory_problem(net, shape, 1, 64, "SGD", "data.batch_size=1", available=4 * 2**30)
    assert "x 1 x 64 workers" in many and "(not even one sample fits with these workers) or the workers" in many
    # HogWild's workers share the weights: one copy less for the second worker
    shared = available - weights
    assert memory_problem(net, shape, 100, 2, "SGD", "b", available=shared, shared_weights=True) is None
    assert memory_problem(net, shape, 100, 2, "SGD", "b", available=shared - 1, shared_weights=True)
    one = memory_problem(net, shape, 500, 1, "SGD", "data.batch_size=500", available=fixed + 10)
    assert "not even one sample fits" in one and "per worker process" not in one  # (this process: counted)
    # a network meta tensors cannot run is not judged (its job builds it on the CPU as before)
    assert memory_problem(ReadsAValue(), (3, 2, 2), 10**9, 1, "SGD", "data.batch_size=1", available=1) is None


def test_the_memory_available_is_read_on_linux():
    available = available_bytes()
    if available is None:
        pytest.skip("no /proc/meminfo: not Linux")
    assert 0 < available < 1 << 50


def test_a_16_bit_run_counts_half_and_a_compiled_one_is_not_judged():
    """bf16-mixed keeps its convolutions' activations in bf16 (half the fp32 count is a lower bound of
    them); torch.compile's graphs may keep fewer tensors than the eager network, so no eager count is
    held against them. Judged with this machine's available memory, at 1.5x the fp32 batch that fits."""
    from conftest import compose_cfg

    from psgd.data.datasets import DataError
    from psgd.models import WideResNet
    from psgd.run_checks import check_memory

    available = available_bytes()
    if available is None:
        pytest.skip("no /proc/meminfo: not Linux")
    net = WideResNet(in_channels=3)
    batch = int(available / activation_bytes_per_sample(net, (3, 32, 32)) * 1.5)
    job = ["model=wide_resnet", "data=cifar10", f"data.batch_size={batch}"]
    with pytest.raises(DataError, match=f"data.batch_size={batch} needs at least "):
        check_memory(compose_cfg(*job), net, 32, [batch], 1)
    check_memory(compose_cfg(*job, "trainer.precision=bf16-mixed"), net, 32, [batch], 1)
    check_memory(compose_cfg(*job, "compile=true"), net, 32, [batch], 1)
    # a shard smaller than the batch is what each worker trains at once: named beside the setting
    with pytest.raises(DataError, match=rf"data.batch_size={batch * 2} \(a batch of {batch}: each worker's whole"):
        check_memory(compose_cfg(*job[:2], f"data.batch_size={batch * 2}"), net, 32, [batch], 1)
